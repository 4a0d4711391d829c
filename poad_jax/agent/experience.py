"""Experience: a rollout's step records -> packed arrays -> behaviour pass -> TokenBatch.

The path of one batch from the rollout to the learner:

1. `pack_batch` (or `pack_batch_agreed` over several processes, with array
   shapes every process shares): the records of `RolloutCollector.collect`,
   thread-major, as padded NumPy arrays with bucketed shapes, in the layout
   of the method's scheme (token level: one row per step with its action
   tokens; action level: the chosen action among its candidates), plus the
   next prompts `[B, P]` for the bootstrap values;
2. `behaviour_statistics`: one jit-compiled pass with the learner's own
   functions (`core/policy.py`) over those arrays: the behaviour log-probs,
   the critic's features and values, and the bootstrap values, so that
   PPO's first ratio is exactly 1;
3. `make_token_batch`: arrays and statistics as the scheme's batch
   (`batch_type`: token or action level, group-relative or not, corrected or not)
   the learner's update takes.
   The behaviour pass itself reads the packed arrays as that batch too (its
   behaviour fields None), so a scheme reads one form of batch everywhere.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from poad_jax.agent.methods import Method
from poad_jax.agent.rollout import RolloutConfig, StepRecord
from poad_jax.core import shared_prefix
from poad_jax.core.layout import bucket_size
from poad_jax.core.policy import FrozenBase, PackedRows, PolicyGraph, base_features, head_values
from poad_jax.core.shared_prefix import PrefixPlan
from poad_jax.core.token_batch import (ActionLevelBatch, CorrectedGroupTokenBatch, CorrectedTokenBatch, GroupTokenBatch,
                                      TokenBatch, TokenLevelBatch, pack_rows)


def thread_major_rows(steps: list[list[StepRecord]]) -> list[StepRecord]:
    """The records `steps[t][b]` in the batch's row order: thread by thread, each thread's steps in time order."""
    return [steps[t][b] for b in range(len(steps[0])) for t in range(len(steps))]


def pack_batch(
    steps: list[list[StepRecord]],
    next_prompts: list[list[int]],
    method: Method,
    config: RolloutConfig,
    pad_id: int,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Packs records (thread-major rows) into padded arrays with bucketed shapes.

    Returns the batch arrays (without behaviour statistics) and the next
    prompts packed `[B, P]` for the bootstrap values.
    """
    num_threads = len(steps[0])
    rows = thread_major_rows(steps)
    prompt_len = bucket_size(
        max(max(len(r.prompt) for r in rows), max(len(p) for p in next_prompts)), config.prompt_buckets
    )
    rewards = np.array([r.reward for r in rows], np.float32)
    dones = np.array([r.done for r in rows], bool)
    arrays = method.scheme.pack(rows, prompt_len, config, pad_id)
    arrays.update(rewards=rewards, dones=dones)
    if method.group is not None:
        arrays["advantages"] = pack_group_advantages(rows, len(steps), method)
        arrays["action_mask"][[n for n, r in enumerate(rows) if r.padding]] = False  # trained on: real steps
    if config.behaviour_logprobs == "sampler":
        arrays["sampler_logprobs"] = pack_sampler_logprobs(rows, arrays["action_mask"].shape[-1])
    if config.pack_behaviour and method.token_level:
        arrays["behaviour_logprobs"] = pack_token_logprobs(rows, arrays["action_mask"].shape[-1], "behaviour_logprobs")
    next_arrays = pack_rows(next_prompts, [[pad_id]] * num_threads, prompt_len, 1, pad_id)
    return arrays, next_arrays


def pack_group_advantages(rows: list[StepRecord], rollout_length: int, method: Method) -> np.ndarray:
    """`[N]` float32: the group-relative advantage of each thread-major row (`GroupRelative.advantages`
    over the rows that are real steps: thread b's trajectory is its rows, their step index their
    position; padding rows get 0)."""
    real = [n for n, r in enumerate(rows) if not r.padding]
    advantages = np.zeros(len(rows), np.float32)
    if real:
        thread, t = np.divmod(np.asarray(real), rollout_length)
        advantages[real] = method.group.advantages(
            np.array([rows[n].reward for n in real], np.float64), thread, t, [rows[n].observation for n in real])
    return advantages


def groups_with_signal(advantages: np.ndarray, group_size: int, rollout_length: int) -> tuple[int, int]:
    """(k, G) for a group method's packed `[N]` advantages (`pack_group_advantages`, thread-major: episode
    group g is the rows of threads `g * group_size ... (g + 1) * group_size - 1`): of the G groups, the k in
    which some row has a non-zero advantage.

    A group whose trajectories all earned the same returns (every one failed, or every one
    succeeded; for GiGPO also every anchor state's returns equal) has advantage 0 on every row:
    the policy loss takes no gradient from it.
    """
    per_group = np.asarray(advantages).reshape(-1, group_size * rollout_length)
    return int(np.count_nonzero(np.any(per_group != 0.0, axis=1))), int(per_group.shape[0])


def pack_sampler_logprobs(rows: list[StepRecord], action_len: int) -> np.ndarray:
    """`[N, A]` float32: each row's `sampler_logprobs` (the sampler's log pi of its action tokens), 0 after them.

    Raises ValueError for a row the sampler did not decode token by token (TWOSOME's candidate
    scores, `restricted_sampling="action_scores"`): its old log-probs must be recomputed.
    """
    return pack_token_logprobs(rows, action_len, "sampler_logprobs")


_MISSING_LOGPROBS = {
    "sampler_logprobs": "behaviour_logprobs='sampler' needs actions decoded token by token (poad or ntpo, "
                        "trie or free-form sampling)",
    "behaviour_logprobs": "ppo.behaviour_correction='importance' needs restricted actions drawn by poad or ntpo "
                          "(trie or action scores)",
}


def pack_token_logprobs(rows: list[StepRecord], action_len: int, field: str) -> np.ndarray:
    """`[N, A]` float32: each row's per-action-token log-probs `row.<field>`, 0 after them;
    ValueError naming the option for a row that has none."""
    packed = np.zeros((len(rows), action_len), np.float32)
    for n, row in enumerate(rows):
        values = getattr(row, field)
        if values is None or len(values) != len(row.action_tokens):
            raise ValueError(f"row {n} has no {field[:-1]} for each action token: {_MISSING_LOGPROBS[field]}")
        packed[n, :len(values)] = values
    return packed


# Packed arrays padded with a constant (masks off) when a shared shape is
# larger than this process's; every other array repeats its last entry along
# a padded axis (TWOSOME's padding candidates repeat the last one, as
# `ActionLevel.pack` makes them).
_PAD_VALUES = {"allowed_tokens": 0, "allowed_mask": False, "candidate_mask": False, "normalizer": 1.0}


def _pad_to(name: str, x: np.ndarray, shape) -> np.ndarray:
    widths = [(0, int(t) - s) for s, t in zip(x.shape, shape)]
    if not any(w for _, w in widths):
        return x
    if name in _PAD_VALUES:
        return np.pad(x, widths, constant_values=_PAD_VALUES[name])
    return np.pad(x, widths, mode="edge")


def pack_batch_agreed(
    steps: list[list[StepRecord]],
    next_prompts: list[list[int]],
    method: Method,
    config: RolloutConfig,
    pad_id: int,
    agree,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """`pack_batch` with array shapes shared by every process of a run.

    `agree(v)` is the elementwise maximum of an integer vector over the
    processes (`parallel.hosts.agree_max`).  Each process packs its rows,
    the processes agree on every array's shape (the maximum of their bucketed
    sizes, which is what packing all rows in one process gives, buckets being
    monotone), and a process whose prompt or action length falls short packs
    again with the shared lengths as its only buckets; a smaller candidate
    count (trie width, TWOSOME's candidates) is padded (`_PAD_VALUES`).
    The rows are then exactly those one process packing every row makes.
    """
    arrays, next_arrays = pack_batch(steps, next_prompts, method, config, pad_id)
    names = sorted(arrays)
    ranks = [np.ndim(arrays[name]) for name in names]
    shared = np.asarray(agree(np.concatenate([np.shape(arrays[name]) for name in names])))
    shapes = dict(zip(names, np.split(shared, np.cumsum(ranks)[:-1])))
    action_len = int(shapes["action_mask"][-1])
    prompt_len = int(shapes["tokens"][-1]) - action_len
    if (prompt_len, action_len) != (np.shape(arrays["tokens"])[-1] - np.shape(arrays["action_mask"])[-1],
                                    np.shape(arrays["action_mask"])[-1]):
        config = dataclasses.replace(config, prompt_buckets=(prompt_len,), action_buckets=(action_len,))
        arrays, next_arrays = pack_batch(steps, next_prompts, method, config, pad_id)
    return {name: _pad_to(name, arrays[name], shapes[name]) for name in names}, next_arrays


@functools.partial(jax.jit, static_argnames=("graph", "method", "temperature", "critic_kind", "plans",
                                             "reference_logprobs"))
def behaviour_statistics(
    graph: PolicyGraph,
    frozen: FrozenBase,
    params: dict[str, Any],
    value_head,
    arrays: dict[str, jax.Array],
    next_arrays: dict[str, jax.Array],
    *,
    method: Method,
    temperature: float,
    critic_kind: str,
    plans: PrefixPlans | None = None,
    reference_logprobs: bool = False,
) -> dict[str, jax.Array]:
    """Old log-probs, critic features, old values and bootstrap values.

    A critic-free method (GRPO, GiGPO) runs no critic: its values and features are zeros,
    and with `reference_logprobs` it adds the frozen base model's log-probs (`ref_logprobs`).

    Computed with the learner's own functions (`policy.py`), so the first
    PPO ratio of an update is exactly 1; except where `arrays` holds the
    sampler's log-probs (`pack_batch` with `behaviour_logprobs="sampler"`):
    those are the old log-probs, the actor's forward is skipped, and the
    first ratio is 1 up to the cached decode's rounding (`bench logprob_gap`).
    `plans` (token level, `prefix_plans`) packs the rows and the next
    prompts with their common prompt prefix once (the same values to rounding).
    """
    scheme = method.scheme
    plans = PrefixPlans(None, None, None) if plans is None else plans
    batch = make_token_batch(arrays, prefix_plan=plans.rows)  # the packed batch, before its behaviour statistics
    critic_lora = params.get("critic_lora", params["actor"])
    use_critic_lora = critic_kind == "lora"
    if "sampler_logprobs" in arrays:
        old_logprobs = jnp.where(batch.action_mask, arrays["sampler_logprobs"], 0.0)
    else:
        old_logprobs, _ = scheme.policy(graph, frozen, params["actor"], batch, temperature)
    if not method.uses_critic:  # group-relative: no critic pass; the reference's log-probs where penalised
        zeros = jnp.zeros(batch.action_mask.shape, jnp.float32)
        stats = {"old_logprobs": old_logprobs, "features": zeros[..., None], "old_values": zeros,
                 "bootstrap_value": jnp.zeros((next_arrays["tokens"].shape[0],), jnp.float32), "ref_logprobs": zeros}
        if reference_logprobs:
            base = jax.tree.map(jnp.zeros_like, params["actor"])  # adapters off: the frozen base model
            stats["ref_logprobs"] = scheme.policy(graph, frozen, base, batch, temperature)[0]
        return stats
    features = scheme.critic_features(graph, frozen, critic_lora, batch, use_critic_lora)
    old_values = head_values(graph, value_head, features)
    next_rows = PackedRows(next_arrays["tokens"], next_arrays["positions"], next_arrays["key_mask"], batch.prompt_len,
                           plans.next_rows)
    next_features = base_features(graph, frozen, critic_lora, next_rows, use_lora=use_critic_lora)[:, 0]
    bootstrap_value = head_values(graph, value_head, next_features)
    return {
        "old_logprobs": old_logprobs,
        "features": features,
        "old_values": old_values,
        "bootstrap_value": bootstrap_value,
    }


BEHAVIOUR_FIELDS = ("old_logprobs", "old_values", "features", "bootstrap_value")


def batch_type(arrays: dict[str, np.ndarray]) -> type:
    """The batch type of packed arrays: `ActionLevelBatch` where they hold the candidates'
    `chosen`; at the token level `GroupTokenBatch` where they hold group `advantages`, else
    `TokenLevelBatch`, each corrected (`CorrectedTokenBatch`, `CorrectedGroupTokenBatch`) where
    they hold the behaviour log-probs (`ppo.behaviour_correction="importance"`)."""
    if "chosen" in arrays:
        return ActionLevelBatch
    corrected = "behaviour_logprobs" in arrays
    if "advantages" in arrays:
        return CorrectedGroupTokenBatch if corrected else GroupTokenBatch
    return CorrectedTokenBatch if corrected else TokenLevelBatch


def make_token_batch(arrays: dict[str, np.ndarray], stats: dict[str, jax.Array] | None = None,
                     prefix_plan: PrefixPlan | None = None) -> TokenBatch:
    """The scheme's batch (`batch_type`, token level with `prefix_plan`) of packed arrays and
    their behaviour statistics (`behaviour_statistics`).  Without `stats` (the behaviour pass
    itself reads the packed rows) the four behaviour fields are None: the one place a batch is
    incomplete, and it never reaches the learner."""
    kind = batch_type(arrays)
    if prefix_plan is not None and kind is ActionLevelBatch:
        raise ValueError("prefix packing is for token-level rows (TWOSOME shares its prompt with share_prompt)")
    behaviour = BEHAVIOUR_FIELDS + (("ref_logprobs",) if issubclass(kind, GroupTokenBatch) else ())
    packed = [f.name for f in dataclasses.fields(kind) if f.name not in behaviour and f.name in arrays]
    stats = {} if stats is None else stats
    extra = {} if prefix_plan is None else {"prefix_plan": prefix_plan}
    return kind(**{name: jnp.asarray(arrays[name]) for name in packed},
                **{name: stats.get(name) for name in behaviour}, **extra)


class PrefixPlans(NamedTuple):
    """The prefix packings of one update (`shared_prefix.plan`; None where a packing saves
    nothing): the learner's micro-batches (`learner`), the behaviour pass over all rows
    (`rows`) and over the next observations' prompts (`next_rows`)."""

    learner: PrefixPlan | None
    rows: PrefixPlan | None
    next_rows: PrefixPlan | None


def prefix_plans(arrays: dict[str, np.ndarray], next_arrays: dict[str, np.ndarray],
                 micro_batch_rows: int) -> PrefixPlans:
    """The packings (`PrefixPlans`) of token-level packed arrays, on the host."""
    prompt_len = np.shape(arrays["tokens"])[-1] - np.shape(arrays["action_mask"])[-1]
    tokens, key_mask = np.asarray(arrays["tokens"]), np.asarray(arrays["key_mask"])
    next_tokens, next_mask = np.asarray(next_arrays["tokens"]), np.asarray(next_arrays["key_mask"])
    return PrefixPlans(
        learner=shared_prefix.plan(tokens, key_mask, prompt_len, micro_batch_rows),
        rows=shared_prefix.plan(tokens, key_mask, prompt_len, len(tokens)),
        next_rows=shared_prefix.plan(next_tokens, next_mask, prompt_len, len(next_tokens)),
    )
