"""Prefill and the ONE decode loop, which takes a next-token rule: free sampling
(`FreeSampling`: temperature, top-k, top-p, stop tokens) or trie-constrained
(`TrieSampling`: only tokens continuing a valid action).

Padding convention (the model's attention rule): prompts are LEFT-padded to
the prompt bucket P, `key_mask` is False on pad slots, positions are the
per-row count of real tokens before the token.  Generated token s is fed
(and cached) at slot P + s of every row, at position `prompt_length[b] + s`.

A rule is a pytree: its settings are static (part of the jit cache key), its
tables (the trie's edges) are arrays, so one compiled loop serves every
trie of the same padded shape.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from poad_jax.core.layout import positions_from_mask
from poad_jax.models.decode import KVCache, init_cache
from poad_jax.sampling.kernels import policy_logprobs, row_keys, sample_allowed, sample_tokens


class DecodeCarry(NamedTuple):
    """State of the decode loop; buffers are `[B, N]` (N = the most tokens a row may get).

    `pending` is the token to feed next (at cache slot `cache.index`,
    position `positions`): the last prompt token at first, then the last
    drawn one.  So each step is forward(pending) -> draw, and no forward is
    wasted on a token after which nothing is drawn.  `node` is the row's trie
    node (trie rule; 0 otherwise).
    """

    cache: KVCache
    key_mask: jax.Array  # [B, S]
    pending: jax.Array  # [B] int32
    positions: jax.Array  # [B] position of the pending token
    tokens: jax.Array  # [B, N] int32
    logprobs: jax.Array  # [B, N] float32
    done: jax.Array  # [B] bool
    step: jax.Array  # int32 scalar: tokens written so far
    node: jax.Array  # [B] int32


# ---------------------------------------------------------------------------
# Next-token rules: (logits [B, V], keys [B, 2], node [B]) -> (token, log-prob, next node, row ends).


@functools.partial(jax.tree_util.register_dataclass, data_fields=[],
                   meta_fields=["temperature", "top_k", "top_p", "stop_ids", "record_policy"])
@dataclasses.dataclass(frozen=True)
class FreeSampling:
    """Any token, from softmax(top-p(top-k(logits / T))) (`kernels.sample_tokens`);
    a row ends at a token of `stop_ids` (kept in the output).  The recorded log-prob is
    the drawn-from distribution's, or with `record_policy` the untruncated policy's
    (`kernels.policy_logprobs`: PPO's old log-probs)."""

    temperature: float
    top_k: int
    top_p: float
    stop_ids: tuple[int, ...]
    record_policy: bool = False

    def __call__(self, logits, keys, node):
        tokens, logprobs = sample_tokens(logits, keys, self.temperature, self.top_k, self.top_p)
        if self.record_policy:
            logprobs = policy_logprobs(logits, tokens, self.temperature)
        stop = jnp.asarray(self.stop_ids if self.stop_ids else (-1,), jnp.int32)
        return tokens, logprobs, node, jnp.isin(tokens, stop)


@functools.partial(jax.tree_util.register_dataclass, data_fields=["edge_token", "edge_child", "edge_valid"],
                   meta_fields=["temperature", "row_local"])
@dataclasses.dataclass(frozen=True)
class TrieSampling:
    """Only the tokens on the row's trie edges (`layout.build_action_tries`),
    from softmax(logits[allowed] / T) (`kernels.sample_allowed`); a row ends
    at a node with no edge (a complete action).

    `row_local` (set on a mesh): read each row's node with a per-row gather
    (`take_along_axis`), which the partitioner keeps on the device holding
    the row; the default `table[arange(B), node]` gathers over (row, node)
    pairs, which on a mesh becomes a gather of other devices' rows every
    token.  Same values either way."""

    edge_token: jax.Array  # [B, N, K]
    edge_child: jax.Array
    edge_valid: jax.Array
    temperature: float
    row_local: bool = False

    def __call__(self, logits, keys, node):
        rows = jnp.arange(node.shape[0])

        def at(table, node):  # table[b, node[b]] for every row b: [B, K]
            if self.row_local:
                return jnp.take_along_axis(table, node[:, None, None], axis=1)[:, 0]
            return table[rows, node]

        allowed, children, valid = at(self.edge_token, node), at(self.edge_child, node), at(self.edge_valid, node)
        choice, logprobs = sample_allowed(logits, allowed, valid, keys, self.temperature)
        tokens = jnp.take_along_axis(allowed, choice[:, None], axis=-1)[:, 0]
        child = jnp.take_along_axis(children, choice[:, None], axis=-1)[:, 0]
        return tokens, logprobs, child, ~jnp.any(at(self.edge_valid, child), axis=-1)


# ---------------------------------------------------------------------------
# Host side, prefill, loop.


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


def prefill(model, unstacked, tokens, mask, n_rows, cache_length: int, cache_dtype, buffer_length: int,
            constrain=None) -> DecodeCarry:
    """Runs the left-padded prompts `[B, P]`, all but the last slot, into a
    fresh cache (`empty_cache`: attention over the prompt's own keys); the last
    prompt token becomes the pending token.  Rows >= n_rows are dummies
    (batch bucket padding): they start done.

    `constrain(carry) -> carry` pins the result's shardings on a mesh
    (`SamplingLayout.constrain_carry`; the partitioner propagates them back
    to the empty cache); None (one device) adds nothing to the program."""
    batch, length = tokens.shape
    cache = init_cache(model.config, batch, cache_length, cache_dtype)
    key_mask = jnp.concatenate([mask, jnp.ones((batch, cache_length - length), bool)], axis=1)
    positions = positions_from_mask(mask)
    if length > 1:
        out = model(tokens[:, :-1], positions[:, :-1], key_mask, cache, return_logits=False, unstacked=unstacked,
                    empty_cache=True)
        cache = out.cache
    carry = DecodeCarry(
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
    return carry if constrain is None else constrain(carry)


def repeat_rows(carry: DecodeCarry, index: jax.Array, n_rows: jax.Array) -> DecodeCarry:
    """The carry of a batch `[B]` whose row b is row `index[b]` of `carry` (a prompt prefilled once
    for every row that has it: its cache, key mask, pending token and position); rows >= n_rows
    are dummies and start done."""
    take = lambda x, axis=0: jnp.take(x, index, axis=axis)
    cache = carry.cache._replace(k=take(carry.cache.k, 1), v=take(carry.cache.v, 1))
    return carry._replace(cache=cache, key_mask=take(carry.key_mask), pending=take(carry.pending),
                          positions=take(carry.positions), tokens=take(carry.tokens), logprobs=take(carry.logprobs),
                          done=jnp.arange(index.shape[0]) >= n_rows, node=take(carry.node))


def decode_loop(model, unstacked, carry: DecodeCarry, rng: jax.Array, rule, constrain=None) -> DecodeCarry:
    """Draws tokens with `rule` until the buffer is full or every row is done.

    Each step feeds the pending token of every row (finished ones too:
    skipping them with `lax.cond` made XLA copy the whole KV cache every
    step), draws the next token with per-row keys (`kernels.row_keys`), and
    writes it; a finished row writes token 0 with log-prob 0.

    `constrain` (on a mesh, `SamplingLayout.constrain_carry`) pins the
    carry's shardings at the loop's entry and after every step, so the
    partitioner keeps the KV cache where its rows live (an unpinned carry
    may be re-laid out, i.e. copied, every token).  None adds nothing.
    """
    batch, buffer_length = carry.tokens.shape
    if constrain is not None:
        carry = constrain(carry)

    def cond(c):
        return (c.step < buffer_length) & ~jnp.all(c.done)

    def body(c):
        out = model(c.pending[:, None], c.positions[:, None], c.key_mask, c.cache, unstacked=unstacked)
        tokens, logprobs, node, ends = rule(out.logits[:, 0], row_keys(rng, batch, c.step), c.node)
        live = ~c.done
        tokens = jnp.where(live, tokens, 0)
        c = c._replace(
            cache=out.cache,
            pending=tokens,
            positions=c.positions + 1,
            tokens=c.tokens.at[:, c.step].set(tokens),
            logprobs=c.logprobs.at[:, c.step].set(jnp.where(live, logprobs, 0.0)),
            node=jnp.where(live, node, c.node),
            done=c.done | (live & ends),
            step=c.step + 1,
        )
        return c if constrain is None else constrain(c)

    return jax.lax.while_loop(cond, body, carry)
