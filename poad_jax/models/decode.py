"""The decode fast path beside the model: KV cache, attention over it,
per-layer weight copies, and the backend-specific storage of 16-bit floats.

`poad_jax.models.llama` is the architecture; everything here is inference
engineering it calls into, and none of it changes a result (tests:
`test_models_llama.py`, unstacked = scanned, cache bits, empty-cache prefill):

- `KVCache` (`init_cache`): keys `[L, B, KV, S, D]`, values `[L, B, KV, D, S]`,
  each laid out with the axis attention contracts over last, so both matmuls
  read the cache as it lies (no transposed copy per layer and step).
- `attend_with_cache`: one layer writes its new keys and values into the
  cache and attends over it; with `empty_cache=True` (prefill into a fresh
  cache) over this call's own keys alone, skipping the empty slots.
- `unstack_weights`: separate per-layer copies of the frozen base, so the
  sampler's decode step runs the layers unrolled (a scan copies each layer's
  weight slice before its matmul).
- The backend-specific choices (`cpu_bit_views()`, `default_dtype()`): XLA:CPU supports
  bfloat16 only as matmul operands and widens any other bfloat16 op (a
  dynamic slice of the layer stack, a gather from the embedding, a cache
  write) to float32 over the whole operand.  On CPU, 16-bit weights are
  therefore sliced and gathered as their uint16 bit pattern (`as_bits`,
  `from_bits`) and a bfloat16 cache is stored as uint16 bits.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp


# ---------------------------------------------------------------------------
# Backend-specific choices: the one place in poad_jax that asks for the backend.


def cpu_bit_views() -> bool:
    """Whether 16-bit floats are stored and moved as uint16 bit patterns: on
    XLA:CPU only (see the module docstring); other backends handle bfloat16
    natively."""
    return jax.default_backend() == "cpu"


def default_dtype():
    """The model dtype `models.load` picks when none is given: float32 on CPU
    (exact parity; XLA:CPU widens bfloat16 outside matmuls anyway), bfloat16
    on accelerators."""
    return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16


# ---------------------------------------------------------------------------
# uint16 bit views of 16-bit float weights.


@functools.partial(jax.tree_util.register_dataclass, data_fields=["bits"], meta_fields=["dtype"])
@dataclasses.dataclass(frozen=True)
class Bits:
    """uint16 bits of a 16-bit float array and that array's dtype (see `as_bits`)."""

    bits: jax.Array
    dtype: Any


def as_bits(x: jax.Array):
    """A 16-bit float array as `Bits` where `cpu_bit_views()`; other arrays unchanged.

    Slicing or gathering the bits, then reinterpreting the slice
    (`from_bits`), keeps the weights 2 bytes wide (the bitcast of the stack is
    loop-invariant, so XLA hoists it out of a decode loop).  Not
    differentiable: only for frozen weights.
    """
    if x.dtype.itemsize == 2 and jnp.issubdtype(x.dtype, jnp.floating) and cpu_bit_views():
        return Bits(jax.lax.bitcast_convert_type(x, jnp.uint16), x.dtype)
    return x


def from_bits(x) -> jax.Array:
    """Inverse of `as_bits`."""
    if isinstance(x, Bits):
        return jax.lax.bitcast_convert_type(x.bits, x.dtype)
    return x


def embedding_rows(table: jax.Array, tokens: jax.Array, dtype) -> jax.Array:
    """`table[tokens]` in `dtype`: gather (the bits, on CPU), then cast, never a cast copy of the table."""
    view = as_bits(table)
    if isinstance(view, Bits):
        return from_bits(Bits(view.bits[tokens], view.dtype)).astype(dtype)
    return table[tokens].astype(dtype)


# ---------------------------------------------------------------------------
# The KV cache.


class KVCache(NamedTuple):
    """Per-layer keys `k [L, B, KV, S, D]` and values `v [L, B, KV, D, S]`;
    `index` = next free slot.  Both are laid out with the dimension attention
    contracts over last (D for q k^T, S for the weighted sum of values).  A
    uint16 cache holds the bit patterns of bfloat16 keys and values."""

    k: jax.Array
    v: jax.Array
    index: jax.Array  # int32 scalar

    @property
    def length(self) -> int:
        """Slots per row (S)."""
        return self.k.shape[3]


def init_cache(config, batch: int, length: int, dtype=jnp.float32) -> KVCache:
    """An empty KV cache of `length` slots for `batch` rows of a model with `config`
    (a `LlamaConfig`).  A bfloat16 cache is stored as uint16 bits where
    `cpu_bit_views()`: XLA:CPU would otherwise convert the whole cache to
    float32 and back on every write."""
    layers, kv, dim = config.num_hidden_layers, config.num_key_value_heads, config.dim_per_head
    if jnp.dtype(dtype) == jnp.bfloat16 and cpu_bit_views():
        dtype = jnp.uint16
    keys = jnp.zeros((layers, batch, kv, length, dim), dtype)
    values = jnp.zeros((layers, batch, kv, dim, length), dtype)
    return KVCache(keys, values, jnp.zeros((), jnp.int32))


def _stored_dtype(cache: jax.Array):
    """The float dtype a cache array holds (bfloat16 for a uint16 one)."""
    return jnp.bfloat16 if cache.dtype == jnp.uint16 else cache.dtype


def _cache_write(cache: jax.Array, new: jax.Array, slot) -> jax.Array:
    """Writes `new` (one layer's block in the cache's layout, leading layer axis
    of 1) into `cache` at index tuple `slot`."""
    new = new.astype(_stored_dtype(cache))
    if cache.dtype == jnp.uint16:
        new = jax.lax.bitcast_convert_type(new, jnp.uint16)
    return jax.lax.dynamic_update_slice(cache, new, slot)


def _cache_read(cache: jax.Array, layer) -> jax.Array:
    """Layer `layer`'s keys `[B, KV, S, D]` or values `[B, KV, D, S]`."""
    values = jax.lax.dynamic_index_in_dim(cache, layer, 0, keepdims=False)
    if cache.dtype == jnp.uint16:
        return jax.lax.bitcast_convert_type(values, jnp.bfloat16)
    return values


def attention_over_cache(q, keys, values, mask, matmul_dtype=None):
    """Grouped-query attention over keys `[B, KV, S, D]` and values
    `[B, KV, D, S]` (the cache's layout):

        out[b, t, (k, g)] = sum_s w[b, k, t, g, s] values[b, k, :, s],
        w[b, k, t, g] = softmax_s(q[b, t, (k, g)] . keys[b, k, s] / sqrt(D) + mask)

    q `[B, T, N, D]` with N = KV * groups, mask `[B, T, S]` -> `[B, T, N, D]`
    in q's dtype.  Both matmuls are plain batched matmuls over (b, k) with
    M = T * groups: at decode (T = 1) no operand needs a transposed copy,
    which at these sizes costs more than the matmuls (docs/performance.md).
    Operands are rounded to `matmul_dtype` when given (else q's dtype);
    accumulation is float32.
    """
    batch, length, num_heads, dim = q.shape
    num_kv, slots = keys.shape[1], keys.shape[2]
    groups, dtype = num_heads // num_kv, q.dtype
    chex.assert_shape(keys, (batch, num_kv, slots, dim))
    chex.assert_shape(values, (batch, num_kv, dim, slots))
    chex.assert_shape(mask, (batch, length, slots))
    operand_dtype = dtype if matmul_dtype is None else matmul_dtype
    batched = (((3,), (3,)), ((0, 1), (0, 1)))  # [b, k, m, c] x [b, k, n, c] -> [b, k, m, n]
    q = q.reshape(batch, length, num_kv, groups, dim).transpose(0, 2, 1, 3, 4)
    q = q.reshape(batch, num_kv, length * groups, dim).astype(operand_dtype)
    scores = jax.lax.dot_general(q, keys.astype(operand_dtype), batched, preferred_element_type=jnp.float32)
    scores = scores.reshape(batch, num_kv, length, groups, slots) / jnp.sqrt(jnp.float32(dim))
    visible = mask[:, None, :, None, :]
    weights = jax.nn.softmax(jnp.where(visible, scores, jnp.finfo(jnp.float32).min), axis=-1)
    weights = jnp.where(visible, weights, 0.0).reshape(batch, num_kv, length * groups, slots)
    out = jax.lax.dot_general(
        weights.astype(operand_dtype), values.astype(operand_dtype), batched, preferred_element_type=jnp.float32
    )
    out = out.reshape(batch, num_kv, length, groups, dim).transpose(0, 2, 1, 3, 4)
    return out.reshape(batch, length, num_heads, dim).astype(dtype)


def attend_with_cache(q, k, v, mask, cache_kv, layer, start, empty_cache: bool, matmul_dtype=None):
    """One layer's attention through the cache.

    Writes the new keys `k` and values `v` (`[B, T, KV, D]`) into layer
    `layer`'s slots `[start, start + T)` of `cache_kv = (keys, values)` (the
    whole stacked cache: it rides in the layer loop's carry, so XLA updates
    it in place), then attends with q `[B, T, N, D]` and mask `[B, T, S]`.
    `empty_cache`: the cache held nothing before this call, so attention runs
    over this call's keys alone (rounded to the cache's dtype, so the numbers
    are those of attending over the cache).  Returns (out, new cache_kv).
    """
    cache_k, cache_v = cache_kv
    length, dtype = q.shape[1], q.dtype
    k_block, v_block = jnp.swapaxes(k, 1, 2), jnp.transpose(v, (0, 2, 3, 1))  # the cache's layout
    cache_k = _cache_write(cache_k, k_block[None], (layer, 0, 0, start, 0))
    cache_v = _cache_write(cache_v, v_block[None], (layer, 0, 0, 0, start))
    if empty_cache:
        keys = k_block.astype(_stored_dtype(cache_k)).astype(dtype)
        values = v_block.astype(_stored_dtype(cache_v)).astype(dtype)
        out = attention_over_cache(q, keys, values, mask[:, :, :length], matmul_dtype)
    else:
        out = attention_over_cache(q, _cache_read(cache_k, layer), _cache_read(cache_v, layer), mask, matmul_dtype)
    return out, (cache_k, cache_v)


def poison_unless_empty(hidden: jax.Array, start: jax.Array) -> jax.Array:
    """`hidden` if the cache was empty (`start == 0`), else NaN: a broken
    `empty_cache` promise gives NaN outputs, never silently wrong ones."""
    return jnp.where(start == 0, hidden, jnp.nan)


# ---------------------------------------------------------------------------
# Unstacked (per-layer) copies of the frozen base.


class UnstackedWeights(NamedTuple):
    """Inference copies of the frozen base (`unstack_weights`): `layers[i]` maps
    each projection name to layer i's `[in, out]` matrix; `head` is the output
    layer `[H, V]`."""

    layers: tuple[dict[str, jax.Array], ...]
    head: jax.Array


def unstack_weights(model, split=None) -> UnstackedWeights:
    """Per-layer copies of a `Llama`'s stacked base weight matrices, and the
    output layer as `[H, V]` (for `Llama.__call__(unstacked=)`).

    Why: a scan slices each layer's weights out of the stack and XLA (CPU and
    GPU) materialises that slice before the matmul, so a memory-bound decode
    step moves every weight twice more than it needs to (and XLA:CPU
    transposes a tied embedding for the output layer on every call).  Costs
    one copy of the decoder's weight matrices (and of a tied embedding);
    norms, biases and LoRA stay stacked (small, and LoRA changes).

    `split(split_layers, stacked, head)` runs the copy (default: eagerly);
    on a mesh it is a jit that lays the copies out
    (`parallel.sampling_layout.SamplingLayout.unstack`).
    """
    stacked = {name: w[...] for name, w in model.layers.weights.items()}
    head = model.lm_head[...] if model.lm_head is not None else model.embed[...]
    if split is None:
        return split_layers(stacked, head, tied=model.lm_head is None)
    return split(functools.partial(split_layers, tied=model.lm_head is None), stacked, head)


def split_layers(stacked: dict[str, jax.Array], head: jax.Array, tied: bool) -> UnstackedWeights:
    """`UnstackedWeights` of stacked matrices `[L, in, out]` (layer i: `w[i]`)
    and the output layer (`[H, V]`, or a tied embedding `[V, H]`, transposed)."""
    layers = tuple({name: w[i] for name, w in stacked.items()} for i in range(len(next(iter(stacked.values())))))
    return UnstackedWeights(layers, jnp.transpose(head) if tied else head)
