"""TWOSOME action scoring: log p(action | prompt) of every candidate action,
each prompt encoded once (its candidates packed after it in one row, each
seeing the prompt and itself: `policy.shared_prompt_token_logprobs`, the
learner's own function), normalised by token count, word count or 1, and
softmax-ed into the action-level policy."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from poad_jax.core.layout import positions_from_mask
from poad_jax.core.policy import action_level_log_policy, shared_prompt_token_logprobs

NORMALIZATIONS = ("token", "word", "none")


@dataclasses.dataclass(frozen=True)
class ActionScores:
    """TWOSOME scores of the candidate actions of one prompt, each `[A]` float32."""

    token_logprob_sums: np.ndarray  # sum_j log p(w_j | prompt, w_<j)
    normalized_logprobs: np.ndarray  # sum / token count | word count | 1
    probs: np.ndarray  # softmax(normalized_logprobs)


def action_normalizers(
    actions: Sequence[Sequence[int]], action_texts: Sequence[str] | None, normalization: str
) -> np.ndarray:
    """TWOSOME's normaliser of each candidate action, `[K]` float32: its token
    count ("token"), the whitespace-separated words of its text ("word") or 1
    ("none").  The one implementation the sampler and `rollout.pack_batch` use."""
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
    if normalization == "word":
        if action_texts is None or len(action_texts) != len(actions):
            raise ValueError("normalization='word' needs action_texts, one string per action")
        counts = np.array([len(t.split()) for t in action_texts], np.float32)
        if np.any(counts == 0):
            raise ValueError("normalization='word': an action text has no words")
        return counts
    if normalization == "token":
        return np.array([len(a) for a in actions], np.float32)
    return np.ones(len(actions), np.float32)


def score_candidates(model, unstacked, prompt, prompt_mask, actions, action_mask, normalizer, candidate_mask):
    """TWOSOME scores of K candidates per prompt, each prompt encoded once.

    prompt `[B, P]` (left padded), actions `[B, K, A]` (right padded),
    normalizer and candidate_mask `[B, K]`.  Returns (sums of token log-probs,
    normalised scores, log pi) `[B, K]`, log pi from
    `policy.action_level_log_policy`, the learner's own function.
    """
    prompt_positions = positions_from_mask(prompt_mask)
    n_prompt = jnp.sum(prompt_mask, axis=-1).astype(jnp.int32)
    action_positions = n_prompt[:, None, None] + jnp.arange(actions.shape[-1], dtype=jnp.int32)
    action_positions = jnp.broadcast_to(action_positions, actions.shape)
    token_logprobs = shared_prompt_token_logprobs(
        model, prompt, prompt_positions, prompt_mask, actions, action_positions, action_mask, unstacked=unstacked
    )
    sums = jnp.sum(jnp.where(action_mask, token_logprobs, 0.0), axis=-1)
    log_pi = action_level_log_policy(token_logprobs, action_mask, normalizer, candidate_mask)
    return sums, sums / normalizer, log_pi


def trie_action_probs(prefix_logprobs: dict[tuple[int, ...], float],
                      actions: Sequence[Sequence[int]]) -> np.ndarray:
    """The probability that trie-constrained sampling at temperature 1 (`Sampler.generate_constrained`)
    picks each action, `[K]` float64, from log p(prefix | prompt) of every prefix of every action:

        pi_trie(a) = prod_j p(a_j | s, a_<j) / sum_{w in next(a_<j)} p(w | s, a_<j),
        p(w | s, a_<j) = exp(log p(a_<j w | s) - log p(a_<j | s)),  log p(() | s) = 0

    where next(a_<j) are the tokens that continue some action.  Actions that are strict prefixes of
    another (the trie's end token) are refused: their "end here" probability is not a prefix sum."""
    actions = [tuple(int(t) for t in a) for a in actions]
    for a in actions:
        if not a:
            raise ValueError("an action has no tokens")
        if any(b != a and b[: len(a)] == a for b in actions):
            raise ValueError(f"action {list(a)} is a strict prefix of another: not supported")
    logp = {(): 0.0, **{tuple(k): float(v) for k, v in prefix_logprobs.items()}}
    probs = np.ones(len(actions))
    for index, action in enumerate(actions):
        for j in range(len(action)):
            children = {b[: j + 1] for b in actions if len(b) > j and b[:j] == action[:j]}
            weight = {child: np.exp(logp[child] - logp[action[:j]]) for child in children}
            probs[index] *= weight[action[: j + 1]] / sum(weight.values())
    return probs


def pack_candidates(rows, normalizers, batch: int, n_actions: int, action_length: int):
    """Host-side arrays of `score_candidates` for the prompts' candidate lists
    `rows[b]` (token-id lists), padded to `batch` x `n_actions` x `action_length`:
    (action tokens, action mask `[B, K, A]`, normalizer, candidate mask `[B, K]`).
    Dummy rows and candidates get normalizer 1 and no mask."""
    action_tokens = np.zeros((batch, n_actions, action_length), np.int32)
    action_mask = np.zeros((batch, n_actions, action_length), bool)
    normalizer = np.ones((batch, n_actions), np.float32)
    candidate_mask = np.zeros((batch, n_actions), bool)
    for b, row in enumerate(rows):
        for i, action in enumerate(row):
            action_tokens[b, i, : len(action)] = action
            action_mask[b, i, : len(action)] = True
        normalizer[b, : len(row)] = normalizers[b]
        candidate_mask[b, : len(row)] = True
    return action_tokens, action_mask, normalizer, candidate_mask
