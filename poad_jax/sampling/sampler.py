"""`Sampler`: bucketed, jit-compiled generation, trie-constrained generation and
TWOSOME scoring of one model.

It keeps the model split as the learner does, `(graphdef, frozen base, LoRA,
rest)`, splits it once at construction and is told when the LoRA weights
change (`set_lora`, e.g. after each PPO update): the state is an argument of
jitted pure functions whose graph definition is fixed, so new weights never
recompile.  Batch size and prompt length are rounded up to buckets (dummy
rows, left padding), which bounds the number of compilations;
`compile_count` counts them (one per trace of a jitted function) and
`matmul_flops` the matmul FLOPs of every call's padded shapes (`poad_jax.core.flops`).

On a device mesh (`Sampler(model, mesh=mesh)`) rows are split over the data
axes and the base is held in its sampling layout
(`poad_jax.parallel.sampling_layout`); without one nothing here makes a
sharding call and the compiled programs are those of one device.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import math
from typing import Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from poad_jax.core.flops import decode_flops, prefill_flops, scoring_flops
from poad_jax.core.layout import ACTION_BUCKETS, COUNT_BUCKETS, PROMPT_BUCKETS, bucket_size, build_action_tries, next_power_of_two
from poad_jax.models.decode import unstack_weights
from poad_jax.models.llama import base_filter
from poad_jax.models.tokenizer import Tokenizer
from poad_jax.parallel.sampling_layout import SamplingLayout
from poad_jax.sampling.config import SamplingConfig
from poad_jax.sampling.loop import FreeSampling, TrieSampling, decode_loop, left_pad, prefill, repeat_rows
from poad_jax.sampling.scoring import (
    NORMALIZATIONS,
    ActionScores,
    action_normalizers,
    pack_candidates,
    score_candidates,
    trie_action_probs,
)

FINISH_STOP_TOKEN = "stop_token"
FINISH_LENGTH = "length"
DEFAULT_BATCH_BUCKETS = COUNT_BUCKETS
DEFAULT_PROMPT_BUCKETS = PROMPT_BUCKETS


def return_freed_memory() -> bool:
    """Hands the C heap's free pages back to the kernel (glibc's `malloc_trim(0)`); False where there is no glibc.

    The per-layer copies are 168 buffers of 0.2-8.3 MiB; once glibc's mmap threshold has grown past them (it
    follows the largest buffer freed, up to 32 MiB) they live in the heap, and freed in its middle they stay
    resident, where the learner's buffers, each one mapping of its own, cannot use them: one more copy of the
    layer matrices at the learner's peak (docs/performance.md, "Where a DataSciCoding run's memory goes")."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except AttributeError:  # a C library without it (musl, macOS's libSystem)
        return False
    return bool(trim(0))


@dataclasses.dataclass(frozen=True)
class Generation:
    """Per prompt: generated ids (stop token included), their log-probs, why it ended."""

    tokens: list[np.ndarray]  # int32 [n_b]
    logprobs: list[np.ndarray]  # float32 [n_b]
    finish_reasons: list[str]  # "stop_token" | "length"
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


class Sampler:
    """Generation, constrained generation and scoring with one model's weights.

    `Sampler(model)` splits `model` once into graph definition, frozen base,
    LoRA state and the rest; `set_lora(lora)` swaps in new LoRA weights (an
    `nnx.State` of the same structure, e.g. `policy.split_policy`'s
    `params["actor"]`).  The base is never re-split: for a new base, make a
    new Sampler.

    `unstack_layers=True` (default) runs the decoder unrolled over per-layer
    copies of the frozen base (`models.decode.unstack_weights`), made once
    here: XLA copies every weight slice a scan takes, so this cuts the bytes a
    memory-bound decode step moves (docs/performance.md), at the cost of one
    more copy of the weight matrices and a longer compilation.
    `cache_dtype`: the KV cache's dtype; by default the model's dtype, or
    bfloat16 when its matmuls take bfloat16 operands (attention rounds keys
    and values to bfloat16 anyway, so the cache changes no result).

    `mesh` (a `('data', 'fsdp', 'tensor')` mesh, `parallel.make_mesh`):
    every call's rows are split over `('data', 'fsdp')`, the batch padded
    with dummy rows to a multiple of data x fsdp; the frozen base and its
    per-layer copies are laid out once, here, by the sampling rules
    (replicated over data and fsdp, split over tensor), LoRA and the rest
    replicated; the decode loop pins the KV cache to its rows.  Results do
    not depend on the mesh beyond float rounding (per-row RNG keys).  None:
    one device, today's programs.  A `parallel.SamplingLayout` instead
    of a mesh sets other rules.
    """

    def __init__(
        self,
        model,
        *,
        batch_buckets: Sequence[int] = DEFAULT_BATCH_BUCKETS,
        prompt_buckets: Sequence[int] = DEFAULT_PROMPT_BUCKETS,
        cache_dtype=None,
        unstack_layers: bool = True,
        mesh=None,
    ):
        for name, buckets in (("batch_buckets", batch_buckets), ("prompt_buckets", prompt_buckets)):
            if not buckets or any(int(b) < 1 for b in buckets):
                raise ValueError(f"{name} must be a non-empty sequence of positive sizes, got {buckets}")
        self.batch_buckets = tuple(sorted(int(b) for b in batch_buckets))
        self.prompt_buckets = tuple(sorted(int(b) for b in prompt_buckets))
        if cache_dtype is None:
            cache_dtype = model.matmul_dtype if model.matmul_dtype is not None else model.dtype
        self.cache_dtype = jnp.dtype(cache_dtype)
        self.vocab_size = model.config.vocab_size
        self.model_config = model.config
        self.compile_count = 0
        self.matmul_flops = 0  # of every call so far, as run (padded rows and slots included)
        self.layout = None
        graphdef, *state = nnx.split(model, base_filter(), nnx.LoRAParam, ...)
        self._graphdef = graphdef
        # Own Variable objects (same arrays): later in-place edits of `model` do not leak in.
        self._base, self._lora, self._rest = jax.tree.map(lambda x: x, state)
        self._copies_released = False  # `release_copies` (one device): `_weights` makes them again
        if mesh is None:
            self.unstacked = unstack_weights(model) if unstack_layers else None
        else:  # the sampling layout, made once (only LoRA moves afterwards: set_lora)
            self.layout = mesh if isinstance(mesh, SamplingLayout) else SamplingLayout(mesh)
            self._base = self.layout.place_base(self._base)
            self._lora, self._rest = self.layout.place_replicated((self._lora, self._rest))
            placed = nnx.merge(graphdef, self._base, self._lora, self._rest)
            self.unstacked = unstack_weights(placed, split=self.layout.unstack) if unstack_layers else None
        constrain = None if self.layout is None else self.layout.constrain_carry

        def merged(base, lora, rest):
            self.compile_count += 1  # runs once per trace, i.e. per compilation
            return nnx.merge(graphdef, base, lora, rest)

        def start(base, lora, rest, unstacked, tokens, mask, n_rows, cache_length, buffer_length):
            model = merged(base, lora, rest)
            return prefill(model, unstacked, tokens, mask, n_rows, cache_length, self.cache_dtype, buffer_length,
                           constrain)

        def decode(base, lora, rest, unstacked, carry, rng, rule):
            return decode_loop(merged(base, lora, rest), unstacked, carry, rng, rule, constrain)

        def score(base, lora, rest, unstacked, *arrays):
            return score_candidates(merged(base, lora, rest), unstacked, *arrays)

        self._prefill = jax.jit(start, static_argnums=(7, 8))
        self._repeat = jax.jit(repeat_rows)
        self._decode = jax.jit(decode, donate_argnums=(4,))
        self._score = jax.jit(score)

    def set_lora(self, lora) -> None:
        """Uses `lora` (same structure as the model's LoRA state) from the next
        call on; compiled functions and the unstacked base copies are kept."""
        if jax.tree.structure(lora) != jax.tree.structure(self._lora):
            raise ValueError("set_lora: the LoRA state's structure differs from the sampler model's")
        self._lora = jax.tree.map(lambda x: x, lora)
        if self.layout is not None:  # replicated (a no-op for LoRA the learner keeps replicated)
            self._lora = self.layout.place_replicated(self._lora)

    def release_copies(self) -> None:
        """Frees the per-layer copies of the base (one device) until the next call makes them again from the
        same arrays: the learner's phase then runs without them (0.7 GB for Qwen2.5-Coder-0.5B in bfloat16,
        docs/performance.md), for one copy of the weight matrices per rollout (a fraction of a second)."""
        if self.layout is None and self.unstacked is not None:
            self.unstacked, self._copies_released = None, True
            return_freed_memory()

    def _weights(self):
        if self._copies_released:  # from the sampler's own base, as made at construction
            self.unstacked = unstack_weights(nnx.merge(self._graphdef, self._base, self._lora, self._rest))
            self._copies_released = False
        return self._base, self._lora, self._rest, self.unstacked

    def _batch(self, rows: int) -> int:
        """Rows a call runs with: the batch bucket of `rows`, on a mesh padded
        with dummy rows to a multiple of data x fsdp."""
        batch = bucket_size(rows, self.batch_buckets)
        return batch if self.layout is None else self.layout.rows(batch)

    def _rows(self, array: np.ndarray) -> jax.Array:
        """A host array `[B, ...]` on the device, or on a mesh split by rows."""
        return jnp.asarray(array) if self.layout is None else self.layout.put_rows(array)

    def _key(self, rng: jax.Array) -> jax.Array:
        return rng if self.layout is None else self.layout.place_replicated(rng)

    def _start(self, prompts, buffer_length: int, share_prompts: bool = False):
        """Buckets and prefills; returns the decode carry.  `share_prompts` (one device): each
        distinct prompt is prefilled once and its rows of the carry repeated (`repeat_rows`)."""
        if share_prompts and self.layout is None:
            distinct = {tuple(p): None for p in prompts}
            if len(distinct) < len(prompts):
                order = {prompt: i for i, prompt in enumerate(distinct)}
                index = np.zeros(self._batch(len(prompts)), np.int32)
                index[:len(prompts)] = [order[tuple(p)] for p in prompts]
                carry = self._start([list(p) for p in distinct], buffer_length)
                return self._repeat(carry, jnp.asarray(index), jnp.int32(len(prompts)))
        batch = self._batch(len(prompts))
        length = bucket_size(max(len(p) for p in prompts), self.prompt_buckets)
        tokens, mask = left_pad(prompts, batch, length)
        self.matmul_flops += prefill_flops(self.model_config, batch, length)
        return self._prefill(*self._weights(), self._rows(tokens), self._rows(mask), jnp.int32(len(prompts)),
                             length + buffer_length, buffer_length)

    def _count_decode(self, carry) -> None:
        """Adds the matmul FLOPs of a finished decode loop (`carry.step` steps over every cache slot)."""
        rows, cache_len = carry.key_mask.shape
        self.matmul_flops += decode_flops(self.model_config, rows, int(carry.step), cache_len)

    def generate(self, prompts: Sequence[Sequence[int]], rng: jax.Array, config: SamplingConfig,
                 tokenizer: Tokenizer | None = None) -> Generation:
        """Samples a continuation of every prompt (token ids, any lengths); without `config.stop_token_ids`
        a sequence stops at one of `tokenizer`'s end ids."""
        prompts = _check_ids(prompts, self.vocab_size)
        stop_ids = config.stop_token_ids
        if not stop_ids and tokenizer is not None:
            stop_ids = tuple(int(t) for t in tokenizer.eos_token_ids)
        stop_ids = tuple(sorted(set(stop_ids)))
        rule = FreeSampling(config.temperature, config.top_k, config.top_p, stop_ids,
                            record_policy=config.logprobs_of == "policy")
        carry = self._start(prompts, config.max_new_tokens, config.share_prompts)
        carry = self._decode(*self._weights(), carry, self._key(rng), rule)
        self._count_decode(carry)
        tokens, logprobs, n_written = np.asarray(carry.tokens), np.asarray(carry.logprobs), int(carry.step)
        out_tokens, out_logprobs, reasons = [], [], []
        for b in range(len(prompts)):
            row = tokens[b, :n_written]
            hits = np.flatnonzero(np.isin(row, stop_ids)) if stop_ids else []
            length, reason = (int(hits[0]) + 1, FINISH_STOP_TOKEN) if len(hits) else (len(row), FINISH_LENGTH)
            out_tokens.append(row[:length].astype(np.int32))
            out_logprobs.append(logprobs[b, :length].astype(np.float32))
            reasons.append(reason)
        texts = None if tokenizer is None else [tokenizer.decode(t.tolist()) for t in out_tokens]
        return Generation(out_tokens, out_logprobs, reasons, texts)

    def generate_constrained(
        self,
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
        prompts = _check_ids(prompts, self.vocab_size)
        if len(candidates) != len(prompts):
            raise ValueError(f"got {len(candidates)} candidate lists for {len(prompts)} prompts")
        if not (temperature >= 0 and math.isfinite(temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
        for b, row in enumerate(candidates):
            for action in row:
                if isinstance(action, (str, bytes)):
                    raise ValueError(f"row {b}: candidate actions must be token ids, not text")
                if any(not 0 <= int(t) < self.vocab_size for t in action):
                    raise ValueError(f"row {b}: a candidate action has a token id outside [0, {self.vocab_size})")
        trie = build_action_tries(candidates, self._batch(len(prompts)), end_token_id)
        edges = (self._rows(a) for a in (trie.edge_token, trie.edge_child, trie.edge_valid))
        rule = TrieSampling(*edges, float(temperature), row_local=self.layout is not None)
        carry = self._start(prompts, next_power_of_two(trie.max_depth, 8))
        carry = self._decode(*self._weights(), carry, self._key(rng), rule)
        self._count_decode(carry)
        tokens, logprobs, nodes = np.asarray(carry.tokens), np.asarray(carry.logprobs), np.asarray(carry.node)
        out_tokens, out_logprobs, index = [], [], []
        for b in range(len(prompts)):
            length = int(trie.node_depth[b, nodes[b]])  # includes an end-of-action token
            out_tokens.append(tokens[b, :length].astype(np.int32))
            out_logprobs.append(logprobs[b, :length].astype(np.float32))
            index.append(int(trie.node_action[b, nodes[b]]))
        return ConstrainedGeneration(out_tokens, out_logprobs, np.array(index, np.int32))

    def score_actions(self, prompt: Sequence[int], actions: Sequence[Sequence[int]], normalization: str = "token",
                      action_texts: Sequence[str] | None = None) -> ActionScores:
        """TWOSOME: log p(action | prompt) of every candidate, the prompt encoded once.

        normalized = sum of token log-probs / (token count | word count | 1),
        probs = softmax(normalized).  "word" counts whitespace-separated words
        of `action_texts`.  (`score_actions_batch` for several prompts.)
        """
        texts = None if action_texts is None else [action_texts]
        return self.score_actions_batch([prompt], [actions], normalization, texts)[0]

    def constrained_action_probs(self, prompt: Sequence[int], actions: Sequence[Sequence[int]]) -> np.ndarray:
        """The probability that `generate_constrained` (temperature 1) picks each of `actions`, `[K]`:
        `scoring.trie_action_probs` of the summed log-probs of every action prefix (POAD's and NTPO's
        behaviour policy on a restricted env, to set beside TWOSOME's `score_actions(...).probs`)."""
        actions = [tuple(int(t) for t in a) for a in _check_ids(actions, self.vocab_size, "action")]
        prefixes = sorted({a[:j] for a in actions for j in range(1, len(a) + 1)})
        sums = self.score_actions(prompt, [list(p) for p in prefixes], normalization="none").token_logprob_sums
        return trie_action_probs(dict(zip(prefixes, np.asarray(sums, np.float64).tolist())), actions)

    def score_actions_batch(
        self,
        prompts: Sequence[Sequence[int]],
        actions: Sequence[Sequence[Sequence[int]]],
        normalization: str = "token",
        action_texts: Sequence[Sequence[str]] | None = None,
    ) -> list[ActionScores]:
        """`score_actions` of several prompts (each with its own candidates) in one
        call: one row per prompt, `prompt | candidate 0 | ... | candidate K-1`,
        through the model once; prompts, candidate counts and lengths bucketed."""
        if normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
        prompts = _check_ids(prompts, self.vocab_size)
        if len(actions) != len(prompts):
            raise ValueError(f"got {len(actions)} candidate lists for {len(prompts)} prompts")
        if action_texts is not None and len(action_texts) != len(prompts):
            raise ValueError(f"got {len(action_texts)} action text lists for {len(prompts)} prompts")
        rows, normalizers = [], []
        for b, row in enumerate(actions):
            if isinstance(row, (str, bytes)) or len(row) == 0:
                raise ValueError("actions must be a non-empty sequence of token-id sequences")
            row = _check_ids(row, self.vocab_size, "action")
            normalizers.append(action_normalizers(row, None if action_texts is None else action_texts[b],
                                                  normalization))
            rows.append(row)
        batch = self._batch(len(prompts))
        prompt_len = bucket_size(max(map(len, prompts)), self.prompt_buckets)
        n_actions = bucket_size(max(map(len, rows)), self.batch_buckets)
        action_len = bucket_size(max(len(a) for r in rows for a in r), ACTION_BUCKETS)
        prompt_tokens, prompt_mask = left_pad(prompts, batch, prompt_len)
        packed = pack_candidates(rows, normalizers, batch, n_actions, action_len)
        self.matmul_flops += scoring_flops(self.model_config, batch, prompt_len, n_actions, action_len)
        sums, normalized, log_pi = self._score(
            *self._weights(), self._rows(prompt_tokens), self._rows(prompt_mask), *map(self._rows, packed))
        sums, normalized, probs = np.asarray(sums), np.asarray(normalized), np.exp(np.asarray(log_pi))
        out = []
        for b, row in enumerate(rows):
            k = len(row)
            scores = ActionScores(sums[b, :k].astype(np.float32), normalized[b, :k].astype(np.float32),
                                  probs[b, :k].astype(np.float32))
            chex.assert_shape([scores.token_logprob_sums, scores.normalized_logprobs, scores.probs], (k,))
            out.append(scores)
        return out
