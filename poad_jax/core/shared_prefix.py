"""Rows whose prompts begin alike, packed so that the common beginning is computed once.

A group of m rows `[m, P + A]` in a TokenBatch's layout (the prompt left padded to P
columns, the action right padded to A) whose prompts all begin with the same C tokens
becomes one packed sequence of T columns:

    prefix (C) | rest of row 0 | rest of row 1 | ... | padding

where the rest of row i is its prompt's other len_i - C tokens followed by its a_i real
action tokens (no padding of either).  Every rest attends to the prefix and to its own
earlier columns (`visibility`), and keeps its row's RoPE positions, so each token sees
the keys and positions it has in its own row: the hidden states are the unpacked rows'
(to float rounding), computed over C + sum_i (len_i - C + a_i) columns instead of
m (P + A).  In DataSciCoding every prompt begins with the same task text, and the
retry prompts that set P leave the other rows' columns mostly padding.

`plan` (host, NumPy) finds C and a static T that holds *any* m rows of the batch (the
learner's micro-batches are drawn inside the compiled update); `pack` (jit) builds the
packed sequences and the columns to read back; `hidden_before_actions` runs the model.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np


class PrefixPlan(NamedTuple):
    """Static shape of a packing: every group of `group_rows` rows shares its first
    `prefix_len` prompt tokens and fits in `packed_len` columns."""

    prefix_len: int
    group_rows: int
    packed_len: int


def common_prefix_len(tokens: np.ndarray, key_mask: np.ndarray, prompt_len: int) -> int:
    """The number of leading prompt tokens every row `[N, P + A]` has in common (at most the
    shortest prompt's length)."""
    lengths = key_mask[:, :prompt_len].sum(axis=1)
    shortest = int(lengths.min())
    starts = prompt_len - lengths
    heads = np.stack([tokens[n, start:start + shortest] for n, start in enumerate(starts)])
    differs = np.any(heads != heads[:1], axis=0)
    return int(np.argmax(differs)) if differs.any() else shortest


def plan(tokens: np.ndarray, key_mask: np.ndarray, prompt_len: int, group_rows: int, *,
         prefix_multiple: int = 32, length_multiple: int = 64) -> PrefixPlan | None:
    """The packing of the rows `[N, P + A]` in groups of `group_rows`, or None where it would
    not save columns.

        C = the common prefix, rounded down to a multiple of `prefix_multiple`
        T = C + the sum of the `group_rows` largest rests (len_i - C + a_i),
            rounded up to a multiple of `length_multiple`

    so that any `group_rows` rows fit.  The roundings keep the number of distinct shapes
    (compilations) small from batch to batch.
    """
    num_rows, length = tokens.shape
    if num_rows % group_rows:
        raise ValueError(f"{num_rows} rows do not split into groups of {group_rows}")
    prefix_len = common_prefix_len(tokens, key_mask, prompt_len) // prefix_multiple * prefix_multiple
    rests = key_mask.sum(axis=1) - prefix_len
    largest = np.sort(rests)[::-1][:group_rows]
    packed_len = -(-(prefix_len + int(largest.sum())) // length_multiple) * length_multiple
    if packed_len >= group_rows * length:
        return None
    return PrefixPlan(int(prefix_len), int(group_rows), int(packed_len))


class PackedGroups(NamedTuple):
    """Packed sequences `[G, T]` (G = N / m groups of m rows): tokens, positions, key_mask,
    visibility `[G, T, T]`, and `action_columns` `[N, A]`: for each row's action token j, the
    flat index (group x T + column) of the column whose hidden state predicts it."""

    tokens: jax.Array
    positions: jax.Array
    key_mask: jax.Array
    visibility: jax.Array
    action_columns: jax.Array


def _pack_group(tokens, positions, key_mask, prompt_len: int, prefix_len: int, packed_len: int):
    """One group `[m, P + A]` -> its packed columns `[T]`, visibility `[T, T]` and the
    group-local action columns `[m, A]` (`pack`)."""
    rows, length = tokens.shape
    action_len = length - prompt_len
    lengths = jnp.sum(key_mask[:, :prompt_len], axis=1)
    starts = prompt_len - lengths  # first real column of each row
    rests = jnp.sum(key_mask, axis=1) - prefix_len
    ends = prefix_len + jnp.cumsum(rests)
    offsets = ends - rests  # first packed column of each row's rest
    column = jnp.arange(packed_len)
    row = jnp.minimum(jnp.searchsorted(ends, column, side="right"), rows - 1)
    in_prefix = column < prefix_len
    real = in_prefix | (column < ends[-1])
    source_row = jnp.where(in_prefix, 0, row)
    source = jnp.where(in_prefix, starts[0] + column, starts[row] + prefix_len + column - offsets[row])
    source = jnp.clip(source, 0, length - 1)
    take = lambda x: jnp.where(real, x[source_row, source], 0)
    block = jnp.where(in_prefix, -1, jnp.where(real, row, rows))
    visibility = (block[None, :] == -1) | (block[None, :] == block[:, None])
    j = jnp.arange(action_len)[None, :]
    own_prompt = (lengths - prefix_len)[:, None]
    action_columns = jnp.where((j == 0) & (own_prompt == 0), prefix_len - 1, offsets[:, None] + own_prompt + j - 1)
    return (take(tokens), take(positions), real, visibility, jnp.clip(action_columns, 0, packed_len - 1))


def pack(tokens: jax.Array, positions: jax.Array, key_mask: jax.Array, prompt_len: int,
         prefix_plan: PrefixPlan) -> PackedGroups:
    """Rows `[N, P + A]` (N a multiple of `prefix_plan.group_rows`; consecutive rows form a group)
    packed by `prefix_plan` (see the module docstring).  The rows' prompts must share their first
    `prefix_plan.prefix_len` tokens and each group's real tokens must fit (`plan` makes it so)."""
    num_rows, length = tokens.shape
    m = prefix_plan.group_rows
    if num_rows % m:
        raise ValueError(f"{num_rows} rows do not split into groups of {m}")
    groups = num_rows // m
    grouped = [x.reshape(groups, m, length) for x in (tokens, positions, key_mask)]
    packed = jax.vmap(lambda *g: _pack_group(*g, prompt_len, prefix_plan.prefix_len, prefix_plan.packed_len))(
        *grouped)
    packed_tokens, packed_positions, packed_mask, visibility, columns = packed
    flat_columns = columns + (jnp.arange(groups) * prefix_plan.packed_len)[:, None, None]
    chex.assert_shape([packed_tokens, packed_positions, packed_mask], (groups, prefix_plan.packed_len))
    return PackedGroups(packed_tokens, packed_positions, packed_mask, visibility,
                        flat_columns.reshape(num_rows, length - prompt_len))


def hidden_before_actions(model, tokens: jax.Array, positions: jax.Array, key_mask: jax.Array, prompt_len: int,
                          prefix_plan: PrefixPlan, *, use_lora: bool, constrain=None) -> jax.Array:
    """`[N, A, H]`: the model's final hidden state at the column before each action token
    (the prompt's last token, then action tokens 0..A-2) of rows `[N, P + A]`, computed over
    their packing by `prefix_plan` (`pack`).  Columns after a row's real action tokens hold
    meaningless values, as in the unpacked rows."""
    packed = pack(tokens, positions, key_mask, prompt_len, prefix_plan)
    hidden = model(packed.tokens, packed.positions, packed.key_mask, use_lora=use_lora, return_logits=False,
                   visibility=packed.visibility, constrain=constrain).hidden
    flat = hidden.reshape(-1, hidden.shape[-1])
    return jnp.take(flat, packed.action_columns, axis=0)
