"""A LLaMA-family decoder (LLaMA / SmolLM2, and Qwen2: biases on q, k, v) in
Flax NNX, with LoRA adapters.  The architecture and nothing else: configs in
`config.py`, loading in `loading.py`, the mixed-precision matmul in
`precision.py`, the decode fast path (KV cache, attention over it, unstacked
weights, the CPU storage of 16-bit floats) in `decode.py`.

Read it top to bottom like the decoder figure: `rms_norm`, `apply_rope`,
`grouped_query_attention`; one layer's units acting on ONE layer's weights
(`linear`, `self_attention`, `swiglu_mlp`, `decoder_layer`); then
`Llama.__call__`: embed -> L x decoder_layer -> final norm -> logits.

- The layers' weights are stacked on a leading layer axis and scanned (one
  layer compiles once, whatever the depth); the sampler's decode step unrolls
  them over per-layer copies instead.  `Llama._decoder_stack` alone chooses.
- Linear weights are `[in, out]` (x @ W), transposed from Hugging Face.
- LoRA adapters are `nnx.LoRAParam` (A `[L, in, r]`, B `[L, r, out]`, B = 0
  at init so a fresh adapter changes no logit), scaled by alpha / r here.
  The frozen base is `nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))`.
- RoPE is Hugging Face's "rotate half"; the GGUF loader undoes GGUF's permutation.

Attention rule (prefill, training and decoding alike): the T new tokens occupy
key slots `[index, index + T)` (index = 0 without a cache); query t attends to
key slot s iff `s <= index + t` and `key_mask[b, s]`.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from poad_jax.models import decode
from poad_jax.models.config import REMAT_POLICIES, LlamaConfig, LoraConfig
from poad_jax.models.decode import KVCache, UnstackedWeights
from poad_jax.models.precision import mixed_einsum


class ModelOutput(NamedTuple):
    """`logits [B, T, V]` (float32, or None), final-norm `hidden [B, T, H]`, cache."""

    logits: jax.Array | None
    hidden: jax.Array
    cache: KVCache | None


# ---------------------------------------------------------------------------
# Pure building blocks.


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in float32."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * weight.astype(jnp.float32)).astype(x.dtype)


def rope_inverse_frequencies(config: LlamaConfig) -> jax.Array:
    """inv_freq[i] = theta^(-2i/D), adjusted by the config's RoPE scaling:
    "linear" (positions / factor) or "llama3" (Llama 3.1's per-band scaling)."""
    dim = config.dim_per_head
    inv_freq = 1.0 / (config.rope_theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    scaling = config.rope_scaling_dict
    if not scaling:
        return inv_freq
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        original = scaling["original_max_position_embeddings"]
        wavelength = 2 * math.pi / inv_freq
        smooth = (original / wavelength - low) / (high - low)
        scaled = jnp.where(wavelength > original / low, inv_freq / factor, inv_freq)
        mid = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        is_mid = (wavelength <= original / low) & (wavelength >= original / high)
        return jnp.where(is_mid, mid, scaled)
    raise NotImplementedError(f"RoPE scaling {kind!r} is not supported")


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """Rotates `x [B, T, N, D]` by angle position * inv_freq ("rotate half").

    With x = [x1, x2] (halves of D): out = [x1 cos - x2 sin, x2 cos + x1 sin].
    """
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, D/2]
    cos, sin = jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x.dtype)


def attention_mask(key_mask: jax.Array, query_length: int, start: jax.Array) -> jax.Array:
    """`[B, T, S]` bool: query t sees key slot s iff s <= start + t and key_mask[b, s]."""
    slots = jnp.arange(key_mask.shape[1])
    query_slots = start + jnp.arange(query_length)
    causal = slots[None, :] <= query_slots[:, None]  # [T, S]
    return causal[None, :, :] & key_mask[:, None, :].astype(bool)


def _attention_weights(scores: jax.Array, visible: jax.Array) -> jax.Array:
    """w = softmax(scores) over the last axis, restricted to `visible` keys;
    a query with no visible key gets all-zero weights."""
    scores = jnp.where(visible, scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1)
    return jnp.where(visible, weights, 0.0)


def grouped_query_attention(q, k, v, mask, matmul_dtype=None):
    """softmax(q k^T / sqrt(D) + mask) v with KV heads shared by query groups.

    q `[B, T, N, D]`, k/v `[B, S, KV, D]`, mask `[B, T, S]` -> `[B, T, N, D]`.
    Scores and softmax run in float32; a query with no visible key gets zeros.
    With `matmul_dtype` the two matmuls take operands of that dtype
    (`mixed_einsum`).
    """
    batch, length, num_heads, dim = q.shape
    num_kv, groups = k.shape[2], num_heads // k.shape[2]
    q = q.reshape(batch, length, num_kv, groups, dim)
    if matmul_dtype is not None:
        scores = mixed_einsum("btkgd,bskd->bkgts", q, k, matmul_dtype)
    else:
        scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32)
    weights = _attention_weights(scores / jnp.sqrt(jnp.float32(dim)), mask[:, None, None, :, :])
    if matmul_dtype is not None:
        out = mixed_einsum("bkgts,bskd->btkgd", weights, v, matmul_dtype).astype(v.dtype)
    else:
        out = jnp.einsum("bkgts,bskd->btkgd", weights.astype(v.dtype), v)
    return out.reshape(batch, length, num_heads, dim)


# ---------------------------------------------------------------------------
# One decoder layer, acting on ONE layer's weights: a dict with "input_norm",
# "post_attention_norm" [H], "weights" {name: [in, out]}, "biases" {name: [out]},
# "lora_a" {name: [in, r]}, "lora_b" {name: [r, out]}.


class LayerSettings(NamedTuple):
    """What every layer of a model shares: its config and numerics (static)."""

    config: LlamaConfig
    dtype: Any  # activations
    matmul_dtype: Any  # None: matmuls in `dtype`; else operands rounded to it (`mixed_einsum`)
    lora_scale: float  # alpha / r


class Attend(NamedTuple):
    """What every layer's attention shares in one forward pass: positions `[B, T]`,
    RoPE frequencies, the mask `[B, T, S]`, the first new slot, and (decode
    only) whether the cache was empty before this call."""

    positions: jax.Array
    inv_freq: jax.Array
    mask: jax.Array
    start: jax.Array
    empty_cache: bool = False


def linear(h: jax.Array, layer: dict, name: str, s: LayerSettings) -> jax.Array:
    """y = h W (+ b) (+ scale * (h A) B): projection `name` with its bias and LoRA update."""
    weight = decode.from_bits(layer["weights"][name])
    if s.matmul_dtype is None:
        y = h @ weight.astype(s.dtype)
    else:
        y = mixed_einsum("bti,io->bto", h, weight, s.matmul_dtype).astype(s.dtype)
    if name in layer["biases"]:
        y = y + layer["biases"][name].astype(s.dtype)
    if name in layer["lora_a"]:
        a, b = layer["lora_a"][name].astype(s.dtype), layer["lora_b"][name].astype(s.dtype)
        y = y + ((h @ a) @ b) * jnp.asarray(s.lora_scale, s.dtype)
    return y


def self_attention(h, layer, s: LayerSettings, at: Attend, cache_kv=None, index=None):
    """Grouped-query self-attention with RoPE on q and k: `[B, T, H] -> [B, T, H]`.

    With `cache_kv` (the stacked cache's (keys, values)) the new keys and
    values are written into layer `index`'s slots and attention runs over the
    cache (`decode.attend_with_cache`).  Returns (output, cache_kv).
    """
    config = s.config
    batch, length, _ = h.shape
    n_heads, n_kv, head_dim = config.num_attention_heads, config.num_key_value_heads, config.dim_per_head
    q = linear(h, layer, "q_proj", s).reshape(batch, length, n_heads, head_dim)
    k = linear(h, layer, "k_proj", s).reshape(batch, length, n_kv, head_dim)
    v = linear(h, layer, "v_proj", s).reshape(batch, length, n_kv, head_dim)
    q, k = apply_rope(q, at.positions, at.inv_freq), apply_rope(k, at.positions, at.inv_freq)
    if cache_kv is None:
        out = grouped_query_attention(q, k, v, at.mask, s.matmul_dtype)
    else:
        out, cache_kv = decode.attend_with_cache(
            q, k, v, at.mask, cache_kv, index, at.start, at.empty_cache, s.matmul_dtype
        )
    return linear(out.reshape(batch, length, n_heads * head_dim), layer, "o_proj", s), cache_kv


def swiglu_mlp(h: jax.Array, layer: dict, s: LayerSettings) -> jax.Array:
    """down(silu(gate(h)) * up(h))."""
    return linear(jax.nn.silu(linear(h, layer, "gate_proj", s)) * linear(h, layer, "up_proj", s), layer, "down_proj", s)


def decoder_layer(x, layer, s: LayerSettings, at: Attend, cache_kv=None, index=None):
    """x + attention(norm(x)), then + mlp(norm(x)) (pre-norm residual block).
    Returns (x, cache_kv)."""
    eps = s.config.rms_norm_eps
    attended, cache_kv = self_attention(rms_norm(x, layer["input_norm"], eps), layer, s, at, cache_kv, index)
    x = x + attended
    x = x + swiglu_mlp(rms_norm(x, layer["post_attention_norm"], eps), layer, s)
    return x, cache_kv


# What the backward pass saves of a layer, per `REMAT_POLICIES` name ("none": everything).
_REMAT_SAVEABLE = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


# ---------------------------------------------------------------------------
# Modules (parameter paths: embed, layers.{input_norm, post_attention_norm,
# weights, biases, lora_a, lora_b}.<name>, final_norm, lm_head).


def _normal(rngs: nnx.Rngs, shape, dtype, std=0.02):
    return jax.random.normal(rngs.params(), shape, dtype) * std


class DecoderLayers(nnx.Module):
    """All decoder layers, weights stacked on a leading layer axis `[L, ...]`."""

    def __init__(
        self, config: LlamaConfig, lora: LoraConfig | None, *, param_dtype, weight_dtype, rngs: nnx.Rngs
    ):
        n_layers, hidden = config.num_hidden_layers, config.hidden_size
        head_dim = config.dim_per_head
        q_out = config.num_attention_heads * head_dim
        kv_out = config.num_key_value_heads * head_dim
        inter = config.intermediate_size
        shapes = {  # a local: a dict attribute would make the GraphDef unhashable
            "q_proj": (hidden, q_out),
            "k_proj": (hidden, kv_out),
            "v_proj": (hidden, kv_out),
            "o_proj": (q_out, hidden),
            "gate_proj": (hidden, inter),
            "up_proj": (hidden, inter),
            "down_proj": (inter, hidden),
        }
        self.input_norm = nnx.Param(jnp.ones((n_layers, hidden), param_dtype))
        self.post_attention_norm = nnx.Param(jnp.ones((n_layers, hidden), param_dtype))
        self.weights = nnx.Dict(
            {
                name: nnx.Param(_normal(rngs, (n_layers, *shape), weight_dtype))
                for name, shape in shapes.items()
            }
        )
        if config.attention_bias:
            self.biases = nnx.Dict(
                {
                    name: nnx.Param(jnp.zeros((n_layers, shapes[name][1]), param_dtype))
                    for name in ("q_proj", "k_proj", "v_proj")
                }
            )
        else:
            self.biases = nnx.Dict({})
        self.lora_a = nnx.Dict({})
        self.lora_b = nnx.Dict({})
        if lora is not None:
            for name in lora.targets:
                fan_in, fan_out = shapes[name]
                bound = 1.0 / math.sqrt(fan_in)  # kaiming-uniform(a=sqrt(5)) bound, as PEFT
                self.lora_a[name] = nnx.LoRAParam(
                    jax.random.uniform(
                        rngs.params(), (n_layers, fan_in, lora.rank), param_dtype, -bound, bound
                    )
                )
                self.lora_b[name] = nnx.LoRAParam(jnp.zeros((n_layers, lora.rank, fan_out), param_dtype))

    def stacked(self, lora_on: bool, with_weights: bool = True) -> dict:
        """The layers' arrays `[L, ...]` in the per-layer dict layout `decoder_layer`
        reads (base weight matrices as `decode.as_bits` views: frozen only)."""
        return {
            "input_norm": self.input_norm[...],
            "post_attention_norm": self.post_attention_norm[...],
            "weights": {name: decode.as_bits(w[...]) for name, w in self.weights.items()} if with_weights else {},
            "biases": {name: b[...] for name, b in self.biases.items()},
            "lora_a": {name: a[...] for name, a in self.lora_a.items()} if lora_on else {},
            "lora_b": {name: b[...] for name, b in self.lora_b.items()} if lora_on else {},
        }


class Llama(nnx.Module):
    """LLaMA / Qwen2 causal decoder with optional LoRA adapters.

    `model(tokens [B, T]) -> ModelOutput` runs positions 0..T-1 with every
    token visible (causally).  Optional: `positions [B, T]`, `key_mask [B, S]`
    (False = a padding slot), `cache` (a `decode.KVCache`: S is its length and
    the new keys go to slots `[cache.index, cache.index + T)`), `use_lora`,
    `return_logits`, `visibility` (`[B or 1, T, S]` bool, ANDed with the
    attention rule: packed continuations of one prompt each see the prompt and
    themselves, `policy.shared_prompt_visibility`).  The decode fast path's
    options (`decode` module): `unstacked` (per-layer weight copies, layers
    unrolled) and `empty_cache=True` (prefill: a promise that the cache holds
    nothing yet, so attention skips its empty slots; broken, it gives NaN).
    `constrain` (x -> x, e.g. a `with_sharding_constraint`) is applied to the
    residual stream at the top of every layer: a device mesh pins activations
    there (`poad_jax.parallel`); None changes nothing.

    Precision: activations in `dtype`; LoRA, norms, biases stored in
    `param_dtype`; `matmul_dtype=jnp.bfloat16` stores the base weight matrices
    in bfloat16 and runs every large matmul as `mixed_einsum` (None: all in
    `dtype`, exact float32 parity).  `remat` changes memory and speed only.
    """

    def __init__(
        self,
        config: LlamaConfig,
        *,
        lora: LoraConfig | None = LoraConfig(),
        dtype=jnp.float32,
        param_dtype=jnp.float32,
        matmul_dtype=None,
        remat: str = "full",
        rngs: nnx.Rngs,
    ):
        if remat not in REMAT_POLICIES:
            raise ValueError(f"remat must be one of {REMAT_POLICIES}, got {remat!r}")
        self.config = config
        self.remat = remat
        self.lora_config = lora
        self.dtype = dtype
        self.matmul_dtype = matmul_dtype
        weight_dtype = param_dtype if matmul_dtype is None else matmul_dtype
        self.embed = nnx.Param(_normal(rngs, (config.vocab_size, config.hidden_size), weight_dtype))
        self.layers = DecoderLayers(config, lora, param_dtype=param_dtype, weight_dtype=weight_dtype, rngs=rngs)
        self.final_norm = nnx.Param(jnp.ones((config.hidden_size,), param_dtype))
        if config.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = nnx.Param(_normal(rngs, (config.hidden_size, config.vocab_size), weight_dtype))

    def __call__(
        self,
        tokens: jax.Array,
        positions: jax.Array | None = None,
        key_mask: jax.Array | None = None,
        cache: KVCache | None = None,
        *,
        use_lora: bool = True,
        return_logits: bool = True,
        unstacked: UnstackedWeights | None = None,
        empty_cache: bool = False,
        visibility: jax.Array | None = None,
        constrain: Callable[[jax.Array], jax.Array] | None = None,
    ) -> ModelOutput:
        batch, length = tokens.shape
        start = jnp.zeros((), jnp.int32) if cache is None else cache.index
        if positions is None:
            positions = jnp.broadcast_to(start + jnp.arange(length, dtype=jnp.int32), (batch, length))
        if key_mask is None:
            key_mask = jnp.ones((batch, length if cache is None else cache.length), bool)
        chex.assert_shape(positions, (batch, length))
        chex.assert_shape(key_mask, (batch, length if cache is None else cache.length))
        mask = attention_mask(key_mask, length, start)
        if visibility is not None:
            mask = mask & visibility
        at = Attend(positions, rope_inverse_frequencies(self.config), mask, start, empty_cache)

        x = decode.embedding_rows(self.embed[...], tokens, self.dtype)
        x, cache = self._decoder_stack(x, at, cache, use_lora, unstacked, constrain)
        hidden = rms_norm(x, self.final_norm[...], self.config.rms_norm_eps)
        if empty_cache and cache is not None:
            hidden = decode.poison_unless_empty(hidden, start)
        logits = self.logits(hidden, unstacked) if return_logits else None
        return ModelOutput(logits, hidden, cache)

    def _decoder_stack(self, x, at: Attend, cache: KVCache | None, use_lora: bool, unstacked, constrain=None):
        """The L decoder layers over `x [B, T, H]`; returns (x, updated cache).

        The one place that chooses how layers run: a `lax.scan` over the
        stacked weights (one layer compiled once), or, given `unstacked`, a
        Python loop over per-layer weight copies (no weight slice copied).
        """
        config = self.config
        lora_on = use_lora and self.lora_config is not None and len(self.layers.lora_a) > 0
        settings = LayerSettings(
            config, self.dtype, self.matmul_dtype, self.lora_config.scale if self.lora_config is not None else 0.0
        )
        stacked = self.layers.stacked(lora_on, with_weights=unstacked is None)

        def step(carry, xs):
            x, cache_kv = carry
            layer, index = xs
            x = x if constrain is None else constrain(x)
            return decoder_layer(x, layer, settings, at, cache_kv, index), None

        if self.remat in _REMAT_SAVEABLE:
            step = jax.checkpoint(step, prevent_cse=False, policy=_REMAT_SAVEABLE[self.remat])
        carry = (x, None if cache is None else (cache.k, cache.v))
        if unstacked is None:
            carry, _ = jax.lax.scan(step, carry, (stacked, jnp.arange(config.num_hidden_layers, dtype=jnp.int32)))
        else:
            chex.assert_equal(len(unstacked.layers), config.num_hidden_layers)
            for i, weights in enumerate(unstacked.layers):
                layer = {**jax.tree.map(lambda a, i=i: a[i], stacked), "weights": weights}
                carry, _ = step(carry, (layer, i))
        x, cache_kv = carry
        if cache is not None:
            cache = KVCache(cache_kv[0], cache_kv[1], cache.index + x.shape[1])
        return x, cache

    def logits(self, hidden: jax.Array, unstacked: UnstackedWeights | None = None) -> jax.Array:
        """Output-layer logits `[..., V]` in float32 from final-norm hidden states."""
        if unstacked is not None:  # the output layer as one [H, V] array
            head = unstacked.head
            if self.matmul_dtype is not None:
                return mixed_einsum("...h,hv->...v", hidden, head, self.matmul_dtype)
            return jnp.matmul(hidden, head.astype(self.dtype), preferred_element_type=jnp.float32)
        if self.matmul_dtype is not None:
            if self.lm_head is None:  # tied: contract with the embedding rows, no transpose copy
                return mixed_einsum("...h,vh->...v", hidden, self.embed[...], self.matmul_dtype)
            return mixed_einsum("...h,hv->...v", hidden, self.lm_head[...], self.matmul_dtype)
        if self.lm_head is None:
            head = self.embed[...].astype(self.dtype).T
        else:
            head = self.lm_head[...].astype(self.dtype)
        return jnp.matmul(hidden, head, preferred_element_type=jnp.float32)


def base_filter():
    """The frozen base weights: every `nnx.Param` that is not a `nnx.LoRAParam`."""
    return nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))
