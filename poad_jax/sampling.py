"""Jit-compiled sampling from a `Llama`: prefill + KV-cache decode, trie-constrained
decoding over a set of valid actions, and TWOSOME action scoring.

How a call runs (Tunix-style): the model is split with `nnx.split` on every
call (its LoRA weights change between PPO updates) and its state is passed as
an argument to jitted pure functions whose graph definition is static, so a
weight update never recompiles.  Batch size and prompt length are rounded up to
buckets (dummy rows, left padding), which bounds the number of compilations;
`Sampler.compile_count` counts them (one per trace of a jitted function).

Padding convention (the model's attention rule): prompts are LEFT-padded to the
prompt bucket P, `key_mask` is False on pad slots, positions are the per-row
count of real tokens before the token.  Decode step s writes slot P + s for
every row, at position `prompt_length[b] + s`.

Log-prob contract: `Generation.logprobs[b][i]` is log pi(token_i) under the
distribution the token was actually drawn from:
    pi = softmax(mask_top_p(mask_top_k(logits / T)))
so with top_k = 0 and top_p = 1 it equals `log_softmax(logits / T)` of a
training-style full forward pass on prompt + generated tokens.  Greedy decoding
(T = 0) records log_softmax(logits) (untempered, unmasked).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from poad_jax.layout import (  # noqa: F401  (bucket_size is part of this module's API)
    ACTION_BUCKETS,
    COUNT_BUCKETS,
    PROMPT_BUCKETS,
    action_trie,
    bucket_size,
    next_power_of_two,
    positions_from_mask,
)
from poad_jax.models.llama import KVCache, init_cache, unstack_weights
from poad_jax.policy import action_level_log_policy, shared_prompt_token_logprobs

FINISH_STOP_TOKEN = "stop_token"
FINISH_STOP_STRING = "stop_string"
FINISH_LENGTH = "length"
NORMALIZATIONS = ("token", "word", "none")
DEFAULT_BATCH_BUCKETS = COUNT_BUCKETS
DEFAULT_PROMPT_BUCKETS = PROMPT_BUCKETS
STOP_STRING_CHUNK = 16  # decode steps between host-side stop-string checks


# ---------------------------------------------------------------------------
# Configuration and results.


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How to draw tokens.  temperature 0 = greedy; top_k 0 = off; top_p 1 = off.

    `stop_token_ids` end a row (the stop token is kept in the output).  When it
    is empty and a tokenizer is passed to `generate`, the tokenizer's
    `eos_token_ids` are used.  `stop_strings` need a tokenizer.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()

    def __post_init__(self):
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        object.__setattr__(self, "stop_strings", tuple(str(s) for s in self.stop_strings))
        if any(s == "" for s in self.stop_strings):
            raise ValueError("stop_strings must not contain the empty string")


@dataclasses.dataclass(frozen=True)
class Generation:
    """Per prompt: generated ids (stop token included), their log-probs, why it ended."""

    tokens: list[np.ndarray]  # int32 [n_b]
    logprobs: list[np.ndarray]  # float32 [n_b]
    finish_reasons: list[str]  # "stop_token" | "stop_string" | "length"
    texts: list[str] | None = None  # decoded tokens, when a tokenizer was given

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(t) for t in self.tokens], np.int32)


@dataclasses.dataclass(frozen=True)
class ConstrainedGeneration:
    """Per prompt: the chosen action's ids, their constrained log-probs, its index."""

    tokens: list[np.ndarray]  # int32 [n_b]
    logprobs: list[np.ndarray]  # float32 [n_b]
    action_index: np.ndarray  # int32 [B]: index into candidates[b]


@dataclasses.dataclass(frozen=True)
class ActionScores:
    """TWOSOME scores of the candidate actions of one prompt, each `[A]` float32."""

    token_logprob_sums: np.ndarray  # sum_j log p(w_j | prompt, w_<j)
    normalized_logprobs: np.ndarray  # sum / token count | word count | 1
    probs: np.ndarray  # softmax(normalized_logprobs)


# ---------------------------------------------------------------------------
# Pure sampling kernels.


def top_k_mask(logits: jax.Array, k: int) -> jax.Array:
    """`[B, V]` bool: True where logits >= the k-th largest logit of the row.

    Ties with the k-th value are all kept.  k = 0 (or k >= V) keeps everything.
    """
    if k <= 0 or k >= logits.shape[-1]:
        return jnp.ones(logits.shape, bool)
    kth = jax.lax.top_k(logits, k)[0][..., -1:]
    return logits >= kth


def top_p_mask(logits: jax.Array, p: float) -> jax.Array:
    """`[B, V]` bool nucleus: token i is kept iff the probability mass of the
    tokens ranked strictly before it (descending probability, ties by index) is
    < p.  So the smallest prefix whose mass reaches p is kept; the top token
    always is.  p = 1 keeps everything (including -inf logits, harmless).
    """
    if p >= 1.0:
        return jnp.ones(logits.shape, bool)
    order = jnp.argsort(-logits, axis=-1, stable=True)
    sorted_probs = jax.nn.softmax(jnp.take_along_axis(logits, order, axis=-1), axis=-1)
    mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
    keep_sorted = mass_before < p
    rows = jnp.arange(logits.shape[0])[:, None]
    return jnp.zeros(logits.shape, bool).at[rows, order].set(keep_sorted)


def sampling_logits(logits: jax.Array, temperature: float, top_k: int, top_p: float) -> jax.Array:
    """`[B, V]` logits of the distribution sampled from: logits / T with the
    tokens outside top-k, then outside the nucleus top-p, set to -inf.
    Requires temperature > 0."""
    scaled = logits.astype(jnp.float32) / temperature
    scaled = jnp.where(top_k_mask(scaled, top_k), scaled, -jnp.inf)
    return jnp.where(top_p_mask(scaled, top_p), scaled, -jnp.inf)


def sample_tokens(
    logits: jax.Array, row_keys: jax.Array, temperature: float, top_k: int, top_p: float
) -> tuple[jax.Array, jax.Array]:
    """Draws one token per row from `logits [B, V]` with keys `[B, 2]`.

    Returns `(tokens [B] int32, logprobs [B] float32)` where logprob is
    log softmax(sampling_logits)[token]; greedy (T = 0) takes the argmax and
    records the untempered log_softmax(logits)[token].
    """
    logits = logits.astype(jnp.float32)
    if temperature == 0:
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        dist = logits
    else:
        dist = sampling_logits(logits, temperature, top_k, top_p)
        tokens = jax.vmap(jax.random.categorical)(row_keys, dist).astype(jnp.int32)
    chosen = jnp.take_along_axis(dist, tokens[:, None], axis=-1)[:, 0]
    logprobs = chosen - jax.nn.logsumexp(dist, axis=-1)
    return tokens, logprobs


# ---------------------------------------------------------------------------
# Host-side helpers (NumPy).


def left_pad(prompts: Sequence[Sequence[int]], batch: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """`(tokens [batch, length] int32, mask [batch, length] bool)`, prompts
    right-aligned.  Dummy rows (beyond len(prompts)) hold one token 0 so no
    attention row is empty."""
    tokens = np.zeros((batch, length), np.int32)
    mask = np.zeros((batch, length), bool)
    for b, prompt in enumerate(prompts):
        if len(prompt):
            tokens[b, length - len(prompt):] = prompt
            mask[b, length - len(prompt):] = True
    mask[len(prompts):, -1] = True
    return tokens, mask


class ActionTrie(NamedTuple):
    """Padded edge tables of one token trie per row (node 0 = root).

    `edge_token/edge_child [B, N, K]` int32, `edge_valid [B, N, K]` bool: the
    allowed next tokens at each node and the node each leads to.
    `node_action [B, N]` int32: the candidate index completed at a leaf, else -1;
    `node_depth [B, N]` int32: tokens from the root.  A row is finished when
    its node has no valid edge.
    """

    edge_token: np.ndarray
    edge_child: np.ndarray
    edge_valid: np.ndarray
    node_action: np.ndarray
    node_depth: np.ndarray
    max_depth: int


def build_action_tries(
    candidates: Sequence[Sequence[Sequence[int]]], batch: int, end_token_id: int | None
) -> ActionTrie:
    """Token tries of the candidate actions, one per row, padded to shared sizes.

    An action that is a strict prefix of another gets an end-of-action edge on
    token `end_token_id` (so that choice has a probability, and the token is
    generated); without `end_token_id` that case is an error.  Duplicate
    actions map to their first index.  Dummy rows get the trie of one
    one-token action.
    """
    rows = [[[int(t) for t in a] for a in row] for row in candidates]
    rows += [[[0]]] * (batch - len(rows))
    tries = [action_trie(actions, end_token_id, b) for b, actions in enumerate(rows)]
    n_nodes = next_power_of_two(max(len(t) for t in tries), 8)
    n_edges = next_power_of_two(max(len(n[0]) for t in tries for n in t), 4)
    edge_token = np.zeros((batch, n_nodes, n_edges), np.int32)
    edge_child = np.zeros((batch, n_nodes, n_edges), np.int32)
    edge_valid = np.zeros((batch, n_nodes, n_edges), bool)
    node_action = np.full((batch, n_nodes), -1, np.int32)
    node_depth = np.zeros((batch, n_nodes), np.int32)
    for b, nodes in enumerate(tries):
        for i, (children, action, depth) in enumerate(nodes):
            for j, (token, child) in enumerate(sorted(children.items())):
                edge_token[b, i, j], edge_child[b, i, j], edge_valid[b, i, j] = token, child, True
            node_action[b, i], node_depth[b, i] = action, depth
    max_depth = int(node_depth.max())
    return ActionTrie(edge_token, edge_child, edge_valid, node_action, node_depth, max_depth)


def _first_stop_string_index(tokens: np.ndarray, tokenizer, stop_strings: Sequence[str]) -> int | None:
    """Index of the first token whose decoded prefix contains a stop string."""
    if not any(s in tokenizer.decode(tokens.tolist()) for s in stop_strings):
        return None
    for i in range(len(tokens)):
        text = tokenizer.decode(tokens[: i + 1].tolist())
        if any(s in text for s in stop_strings):
            return i
    return None


# ---------------------------------------------------------------------------
# Device-side loops.


class DecodeCarry(NamedTuple):
    """State of the decode loop; buffers are `[B, N]` (N = max new tokens).

    `pending` is the token to feed next (at cache slot `cache.index`,
    position `positions`): the last prompt token at first, then the last
    sampled one.  So each step is forward(pending) -> sample, and no forward
    is wasted on a token after which nothing is sampled.
    """

    cache: KVCache
    key_mask: jax.Array  # [B, S]
    pending: jax.Array  # [B] int32
    positions: jax.Array  # [B] position of the pending token
    tokens: jax.Array  # [B, N] int32
    logprobs: jax.Array  # [B, N] float32
    done: jax.Array  # [B] bool
    step: jax.Array  # int32 scalar: tokens written so far
    node: jax.Array  # [B] trie node (constrained decoding; unused otherwise)


def _prefill(
    model, unstacked, tokens, mask, n_rows, cache_length: int, cache_dtype, buffer_length: int
) -> DecodeCarry:
    """Runs the left-padded prompts `[B, P]`, all but the last slot, into a
    fresh cache; the last prompt token becomes the pending token.

    Rows >= n_rows are dummies (batch bucket padding): they start done.
    """
    batch, length = tokens.shape
    cache = init_cache(model.config, batch, cache_length, cache_dtype)
    key_mask = jnp.concatenate([mask, jnp.ones((batch, cache_length - length), bool)], axis=1)
    positions = positions_from_mask(mask)
    if length > 1:
        out = model(tokens[:, :-1], positions[:, :-1], key_mask, cache, return_logits=False, unstacked=unstacked,
                    empty_cache=True)
        cache = out.cache
    return DecodeCarry(
        cache=cache,
        key_mask=key_mask,
        pending=tokens[:, -1],
        positions=positions[:, -1],
        tokens=jnp.zeros((batch, buffer_length), jnp.int32),
        logprobs=jnp.zeros((batch, buffer_length), jnp.float32),
        done=jnp.arange(batch) >= n_rows,
        step=jnp.zeros((), jnp.int32),
        node=jnp.zeros((batch,), jnp.int32),
    )


def _next_logits(model, unstacked, carry: DecodeCarry) -> tuple[jax.Array, KVCache]:
    """Feeds the pending token of every row; returns next-token logits `[B, V]`
    and the updated cache.  (Every row runs, finished ones too: skipping the
    forward with `lax.cond` made XLA copy the whole KV cache every step.)"""
    out = model(carry.pending[:, None], carry.positions[:, None], carry.key_mask, carry.cache, unstacked=unstacked)
    return out.logits[:, 0], out.cache


def _decode_loop(model, unstacked, carry, rng, end_step, temperature, top_k, top_p, stop_ids) -> DecodeCarry:
    """Samples until step == end_step or every row is done (stop token)."""
    stop = jnp.asarray(stop_ids if stop_ids else (-1,), jnp.int32)
    row_ids = jnp.arange(carry.done.shape[0])

    def cond(c):
        return (c.step < end_step) & ~jnp.all(c.done)

    def body(c):
        logits, cache = _next_logits(model, unstacked, c)
        keys = jax.vmap(lambda r: jax.random.fold_in(jax.random.fold_in(rng, r), c.step))(row_ids)
        tokens, logprobs = sample_tokens(logits, keys, temperature, top_k, top_p)
        live = ~c.done
        tokens = jnp.where(live, tokens, 0)
        return c._replace(
            cache=cache,
            pending=tokens,
            positions=c.positions + 1,
            tokens=c.tokens.at[:, c.step].set(tokens),
            logprobs=c.logprobs.at[:, c.step].set(jnp.where(live, logprobs, 0.0)),
            done=c.done | (live & jnp.isin(tokens, stop)),
            step=c.step + 1,
        )

    return jax.lax.while_loop(cond, body, carry)


def _constrained_loop(model, unstacked, carry, rng, trie, temperature, max_steps) -> DecodeCarry:
    """Walks each row's trie: at node n only `edge_token[b, n]` are allowed,
    drawn from softmax(logits[allowed] / T) (argmax when T = 0, log-prob then
    untempered); stops at a leaf."""
    edge_token, edge_child, edge_valid = trie
    row_ids = jnp.arange(carry.done.shape[0])

    def allowed(node):
        return (
            edge_token[row_ids, node],
            edge_child[row_ids, node],
            edge_valid[row_ids, node],
        )

    def cond(c):
        return (c.step < max_steps) & ~jnp.all(c.done)

    def body(c):
        logits, cache = _next_logits(model, unstacked, c)
        tokens_k, child_k, valid_k = allowed(c.node)  # [B, K]
        logits_k = jnp.take_along_axis(logits, tokens_k, axis=-1)
        if temperature > 0:
            logits_k = logits_k / temperature
        logits_k = jnp.where(valid_k, logits_k, -jnp.inf)
        if temperature == 0:
            choice = jnp.argmax(logits_k, axis=-1)
        else:
            keys = jax.vmap(lambda r: jax.random.fold_in(jax.random.fold_in(rng, r), c.step))(row_ids)
            choice = jax.vmap(jax.random.categorical)(keys, logits_k)
        logprob = jnp.take_along_axis(jax.nn.log_softmax(logits_k, axis=-1), choice[:, None], axis=-1)[:, 0]
        token = jnp.take_along_axis(tokens_k, choice[:, None], axis=-1)[:, 0]
        child = jnp.take_along_axis(child_k, choice[:, None], axis=-1)[:, 0]
        live = ~c.done
        node = jnp.where(live, child, c.node)
        token = jnp.where(live, token, 0)
        return c._replace(
            cache=cache,
            pending=token,
            positions=c.positions + 1,
            tokens=c.tokens.at[:, c.step].set(token),
            logprobs=c.logprobs.at[:, c.step].set(jnp.where(live, logprob, 0.0)),
            node=node,
            done=c.done | ~jnp.any(allowed(node)[2], axis=-1),
            step=c.step + 1,
        )

    return jax.lax.while_loop(cond, body, carry)


def _score_candidates(model, unstacked, prompt, prompt_mask, actions, action_mask, normalizer, candidate_mask):
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


# ---------------------------------------------------------------------------
# The sampler.


class _StaticGraph:
    """A graph definition usable as a static jit argument.

    `nnx.GraphDef` is not always hashable (a module attribute holding a dict
    makes it unhashable), so the sampler interns equal graph definitions and
    hashes this wrapper by its intern index.
    """

    def __init__(self, graphdef, index: int):
        self.graphdef, self.index = graphdef, index

    def __hash__(self):
        return hash(self.index)

    def __eq__(self, other):
        return isinstance(other, _StaticGraph) and other.index == self.index


class Sampler:
    """Bucketed, jit-compiled generation, constrained generation and scoring.

    Holds compiled functions, the compile counter and (with
    `unstack_layers`) per-layer copies of the last model's frozen base
    weights; the model is passed on every call.

    `unstack_layers=True` (default) runs the decoder as an unrolled loop over
    separate per-layer weight arrays (`poad_jax.models.llama.unstack_weights`)
    instead of a scan over the stacked weights: XLA copies every weight slice
    a scan takes, so this cuts the bytes a memory-bound decode step moves
    (docs/performance.md).  It costs one extra copy of the decoder's weight
    matrices in memory, made once per base model (the copy is reused while
    the base weight arrays stay the same objects; LoRA updates do not
    invalidate it), and a longer compilation.
    """

    def __init__(
        self,
        *,
        batch_buckets: Sequence[int] = DEFAULT_BATCH_BUCKETS,
        prompt_buckets: Sequence[int] = DEFAULT_PROMPT_BUCKETS,
        cache_dtype=None,
        unstack_layers: bool = True,
    ):
        for name, buckets in (("batch_buckets", batch_buckets), ("prompt_buckets", prompt_buckets)):
            if not buckets or any(int(b) < 1 for b in buckets):
                raise ValueError(f"{name} must be a non-empty sequence of positive sizes, got {buckets}")
        self.batch_buckets = tuple(sorted(int(b) for b in batch_buckets))
        self.prompt_buckets = tuple(sorted(int(b) for b in prompt_buckets))
        self.cache_dtype = cache_dtype
        self.unstack_layers = bool(unstack_layers)
        self.compile_count = 0
        self._graphs: list[_StaticGraph] = []
        self._unstacked: tuple[tuple[Any, ...], Any] | None = None  # (source arrays, their copies)

        def prefill(graphdef, state, unstacked, tokens, mask, n_rows, cache_length, cache_dtype, buffer_length):
            self.compile_count += 1  # runs once per trace, i.e. per compilation
            model = nnx.merge(graphdef.graphdef, state)
            return _prefill(model, unstacked, tokens, mask, n_rows, cache_length, cache_dtype, buffer_length)

        def decode(graphdef, state, unstacked, carry, rng, end_step, temperature, top_k, top_p, stop_ids):
            self.compile_count += 1
            model = nnx.merge(graphdef.graphdef, state)
            return _decode_loop(model, unstacked, carry, rng, end_step, temperature, top_k, top_p, stop_ids)

        def constrained(graphdef, state, unstacked, carry, rng, trie, temperature, max_steps):
            self.compile_count += 1
            model = nnx.merge(graphdef.graphdef, state)
            return _constrained_loop(model, unstacked, carry, rng, trie, temperature, max_steps)

        def score(graphdef, state, unstacked, prompt, prompt_mask, actions, action_mask, normalizer, candidate_mask):
            self.compile_count += 1
            model = nnx.merge(graphdef.graphdef, state)
            return _score_candidates(
                model, unstacked, prompt, prompt_mask, actions, action_mask, normalizer, candidate_mask
            )

        self._prefill = jax.jit(prefill, static_argnums=(0, 6, 7, 8))
        self._decode = jax.jit(decode, static_argnums=(0, 6, 7, 8, 9), donate_argnums=(3,))
        self._constrained = jax.jit(constrained, static_argnums=(0, 6, 7), donate_argnums=(3,))
        self._score = jax.jit(score, static_argnums=(0,))

    # -- helpers -------------------------------------------------------------

    def _split(self, model) -> tuple[_StaticGraph, Any]:
        """`nnx.split` with the graph definition interned (equal graphs -> same key)."""
        graphdef, state = nnx.split(model)
        for graph in self._graphs:
            if graph.graphdef == graphdef:
                return graph, state
        graph = _StaticGraph(graphdef, len(self._graphs))
        self._graphs.append(graph)
        return graph, state

    def _unstacked_weights(self, model):
        """`unstack_weights(model)`, cached per base model; None when `unstack_layers` is off."""
        if not self.unstack_layers:
            return None
        sources = tuple(w[...] for w in model.layers.weights.values()) + (model.embed[...],) + (
            (model.lm_head[...],) if model.lm_head is not None else ())
        if self._unstacked is None or len(self._unstacked[0]) != len(sources) or any(
            a is not b for a, b in zip(self._unstacked[0], sources)
        ):
            self._unstacked = None  # release the old copy before making the new one
            self._unstacked = (sources, unstack_weights(model))
        return self._unstacked[1]

    def _cache_dtype(self, model):
        """The given cache dtype; by default the model's dtype, or bfloat16 when the
        model's matmuls take bfloat16 operands (attention rounds keys and values
        to bfloat16 anyway, so a bfloat16 cache changes no result)."""
        if self.cache_dtype is not None:
            return jnp.dtype(self.cache_dtype)
        if getattr(model, "matmul_dtype", None) is not None:
            return jnp.dtype(model.matmul_dtype)
        return jnp.dtype(model.dtype)

    @staticmethod
    def _check_ids(sequences, vocab_size: int, what: str = "prompt") -> list[list[int]]:
        """Validated token-id rows; a one-line ValueError on bad input."""
        if isinstance(sequences, (str, bytes)) or len(sequences) == 0:
            raise ValueError(f"{what}s must be a non-empty sequence of token-id sequences")
        rows = []
        for b, sequence in enumerate(sequences):
            if isinstance(sequence, (str, bytes)):
                raise ValueError(f"{what} {b} is text; encode it to token ids first")
            try:
                row = [int(t) for t in sequence]
            except (TypeError, ValueError):
                raise ValueError(f"{what} {b} is not a sequence of integer token ids") from None
            if not row:
                raise ValueError(f"{what} {b} is empty")
            if min(row) < 0 or max(row) >= vocab_size:
                raise ValueError(f"{what} {b} has a token id outside [0, {vocab_size})")
            rows.append(row)
        return rows

    def _start(self, model, prompts, buffer_length: int):
        """Buckets and prefills; returns (graphdef, state, unstacked, carry)."""
        graphdef, state = self._split(model)
        unstacked = self._unstacked_weights(model)
        batch = bucket_size(len(prompts), self.batch_buckets)
        length = bucket_size(max(len(p) for p in prompts), self.prompt_buckets)
        tokens, mask = left_pad(prompts, batch, length)
        carry = self._prefill(
            graphdef, state, unstacked, jnp.asarray(tokens), jnp.asarray(mask), jnp.int32(len(prompts)),
            length + buffer_length, self._cache_dtype(model), buffer_length,
        )
        return graphdef, state, unstacked, carry

    # -- public API ----------------------------------------------------------

    def generate(
        self,
        model,
        prompts: Sequence[Sequence[int]],
        rng: jax.Array,
        config: SamplingConfig,
        tokenizer=None,
    ) -> Generation:
        """Samples a continuation of every prompt (token ids, any lengths)."""
        prompts = self._check_ids(prompts, model.config.vocab_size)
        if config.stop_strings and tokenizer is None:
            raise ValueError("stop_strings need a tokenizer: pass tokenizer=...")
        stop_ids = config.stop_token_ids
        if not stop_ids and tokenizer is not None:
            stop_ids = tuple(int(t) for t in getattr(tokenizer, "eos_token_ids", ()))
        stop_ids = tuple(sorted(set(stop_ids)))
        n_new = config.max_new_tokens
        graphdef, state, unstacked, carry = self._start(model, prompts, n_new)
        chunk = STOP_STRING_CHUNK if config.stop_strings else n_new
        sampled = (float(config.temperature), int(config.top_k), float(config.top_p), stop_ids)
        stop_string_at: dict[int, int] = {}
        end = 0
        while end < n_new:
            end = min(end + chunk, n_new)
            carry = self._decode(graphdef, state, unstacked, carry, rng, jnp.int32(end), *sampled)
            if config.stop_strings:
                carry = self._mark_stop_strings(carry, prompts, stop_ids, tokenizer, config, stop_string_at)
            if bool(jnp.all(carry.done)):
                break
        tokens = np.asarray(carry.tokens)
        logprobs = np.asarray(carry.logprobs)
        n_written = int(carry.step)
        out_tokens, out_logprobs, reasons = [], [], []
        for b in range(len(prompts)):
            row = tokens[b, :n_written]
            hits = np.flatnonzero(np.isin(row, stop_ids)) if stop_ids else []
            at_token = int(hits[0]) if len(hits) else None
            at_string = stop_string_at.get(b)
            if at_string is not None and (at_token is None or at_string < at_token):
                length, reason = at_string + 1, FINISH_STOP_STRING
            elif at_token is not None:
                length, reason = at_token + 1, FINISH_STOP_TOKEN
            else:
                length, reason = len(row), FINISH_LENGTH
            out_tokens.append(row[:length].astype(np.int32))
            out_logprobs.append(logprobs[b, :length].astype(np.float32))
            reasons.append(reason)
        texts = None
        if tokenizer is not None:
            texts = [tokenizer.decode(t.tolist()) for t in out_tokens]
        return Generation(out_tokens, out_logprobs, reasons, texts)

    def _mark_stop_strings(self, carry, prompts, stop_ids, tokenizer, config, stop_string_at):
        """Host check between decode chunks: rows whose text now contains a stop
        string are marked done (so the loop may end early)."""
        tokens = np.asarray(carry.tokens)[:, : int(carry.step)]
        done = np.asarray(carry.done).copy()
        for b in range(len(prompts)):
            if b in stop_string_at:
                continue
            row = tokens[b]
            hits = np.flatnonzero(np.isin(row, stop_ids)) if stop_ids else []
            if len(hits):
                row = row[: hits[0] + 1]
            index = _first_stop_string_index(row, tokenizer, config.stop_strings)
            if index is not None:
                stop_string_at[b] = index
                done[b] = True
        return carry._replace(done=jnp.asarray(done))

    def generate_constrained(
        self,
        model,
        prompts: Sequence[Sequence[int]],
        candidates: Sequence[Sequence[Sequence[int]]],
        rng: jax.Array,
        temperature: float = 1.0,
        *,
        end_token_id: int | None = None,
    ) -> ConstrainedGeneration:
        """Samples one of `candidates[b]` (token-id sequences) for each prompt,
        token by token, each step restricted to tokens continuing a valid action.

        log-probs are those of the renormalised constrained distribution
        softmax(logits[allowed] / T).  If an action is a strict prefix of
        another, the choice "end here" is the token `end_token_id` (generated,
        and scored like any other allowed token).
        """
        prompts = self._check_ids(prompts, model.config.vocab_size)
        if len(candidates) != len(prompts):
            raise ValueError(f"got {len(candidates)} candidate lists for {len(prompts)} prompts")
        if not (temperature >= 0 and math.isfinite(temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
        vocab = model.config.vocab_size
        for b, row in enumerate(candidates):
            for action in row:
                if isinstance(action, (str, bytes)):
                    raise ValueError(f"row {b}: candidate actions must be token ids, not text")
                if any(not 0 <= int(t) < vocab for t in action):
                    raise ValueError(f"row {b}: a candidate action has a token id outside [0, {vocab})")
        batch = bucket_size(len(prompts), self.batch_buckets)
        trie = build_action_tries(candidates, batch, end_token_id)
        max_steps = next_power_of_two(trie.max_depth, 8)
        graphdef, state, unstacked, carry = self._start(model, prompts, max_steps)
        edges = tuple(jnp.asarray(a) for a in (trie.edge_token, trie.edge_child, trie.edge_valid))
        carry = self._constrained(graphdef, state, unstacked, carry, rng, edges, float(temperature), max_steps)
        tokens, logprobs = np.asarray(carry.tokens), np.asarray(carry.logprobs)
        nodes = np.asarray(carry.node)
        out_tokens, out_logprobs, index = [], [], []
        for b in range(len(prompts)):
            action = int(trie.node_action[b, nodes[b]])
            length = int(trie.node_depth[b, nodes[b]])  # includes an end-of-action token
            out_tokens.append(tokens[b, :length].astype(np.int32))
            out_logprobs.append(logprobs[b, :length].astype(np.float32))
            index.append(action)
        return ConstrainedGeneration(out_tokens, out_logprobs, np.array(index, np.int32))

    def score_actions(
        self,
        model,
        prompt: Sequence[int],
        actions: Sequence[Sequence[int]],
        normalization: str = "token",
        action_texts: Sequence[str] | None = None,
    ) -> ActionScores:
        """TWOSOME: log p(action | prompt) of every candidate, the prompt encoded once.

        normalized = sum of token log-probs / (token count | word count | 1),
        probs = softmax(normalized).  "word" counts whitespace-separated words
        of `action_texts`.  (`score_actions_batch` for several prompts.)
        """
        texts = None if action_texts is None else [action_texts]
        return self.score_actions_batch(model, [prompt], [actions], normalization, texts)[0]

    def score_actions_batch(
        self,
        model,
        prompts: Sequence[Sequence[int]],
        actions: Sequence[Sequence[Sequence[int]]],
        normalization: str = "token",
        action_texts: Sequence[Sequence[str]] | None = None,
    ) -> list[ActionScores]:
        """`score_actions` of several prompts (each with its own candidates) in one call.

        One row per prompt, `prompt | candidate 0 | ... | candidate K-1`, runs
        through the model once (`policy.shared_prompt_token_logprobs`, the
        learner's function); prompts, candidate counts and candidate lengths
        are bucketed.
        """
        if normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
        prompts = self._check_ids(prompts, model.config.vocab_size)
        if len(actions) != len(prompts):
            raise ValueError(f"got {len(actions)} candidate lists for {len(prompts)} prompts")
        if action_texts is not None and len(action_texts) != len(prompts):
            raise ValueError(f"got {len(action_texts)} action text lists for {len(prompts)} prompts")
        rows, normalizers = [], []
        for b, row in enumerate(actions):
            if isinstance(row, (str, bytes)) or len(row) == 0:
                raise ValueError("actions must be a non-empty sequence of token-id sequences")
            row = self._check_ids(row, model.config.vocab_size, "action")
            texts = None if action_texts is None else action_texts[b]
            normalizers.append(action_normalizers(row, texts, normalization))
            rows.append(row)
        graphdef, state = self._split(model)
        batch = bucket_size(len(prompts), self.batch_buckets)
        length = bucket_size(max(len(p) for p in prompts), self.prompt_buckets)
        n_actions = bucket_size(max(len(r) for r in rows), self.batch_buckets)
        action_length = bucket_size(max(len(a) for r in rows for a in r), ACTION_BUCKETS)
        prompt_tokens, prompt_mask = left_pad(prompts, batch, length)
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
        sums, normalized, log_pi = self._score(
            graphdef, state, self._unstacked_weights(model), jnp.asarray(prompt_tokens), jnp.asarray(prompt_mask),
            jnp.asarray(action_tokens), jnp.asarray(action_mask), jnp.asarray(normalizer),
            jnp.asarray(candidate_mask),
        )
        sums, normalized, probs = np.asarray(sums), np.asarray(normalized), np.exp(np.asarray(log_pi))
        out = []
        for b, row in enumerate(rows):
            k = len(row)
            scores = ActionScores(sums[b, :k].astype(np.float32), normalized[b, :k].astype(np.float32),
                                  probs[b, :k].astype(np.float32))
            chex.assert_shape([scores.token_logprob_sums, scores.normalized_logprobs, scores.probs], (k,))
            out.append(scores)
        return out
