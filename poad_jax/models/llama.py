"""A LLaMA-family decoder in Flax NNX, with LoRA adapters and a KV cache.

This file is the model and nothing else (loading and conversion live in
`poad_jax.models.loading`).  It covers LLaMA (SmolLM2) and Qwen2 (LLaMA with
biases on the q, k, v projections).

Layout choices:
- The decoder layers' weights are stacked along a leading layer axis and the
  forward pass runs `jax.lax.scan` over them: one layer is traced and
  compiled once, whatever the depth (30 layers compile as fast as one).
- Linear weights are stored `[in, out]` (x @ W), i.e. transposed from the
  Hugging Face `[out, in]` convention; the loader transposes.
- LoRA adapters are `nnx.LoRAParam` variables (A `[L, in, r]`, B `[L, r, out]`,
  B zero-initialised so a fresh adapter changes no logit); their update is
  scaled by alpha / r here (NNX does not scale).  Base weights are plain
  `nnx.Param`: the frozen base is `nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))`.
- RoPE follows the Hugging Face "rotate half" convention (q/k weights in HF
  order); the GGUF loader undoes GGUF's interleaving permutation.

Attention semantics (one rule for prefill, training and decoding): the T new
tokens occupy key slots `[index, index + T)` (index = 0 without a cache); query
t may attend to key slot s iff `s <= index + t` and `key_mask[b, s]`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
from flax import nnx

# Rematerialisation of the scanned decoder layer under differentiation:
#   none  save every residual of all layers for the backward pass;
#   full  save only each layer's input, recompute the layer in the backward
#         pass (least memory; on the 2-core CPU also the fastest, since
#         stacking 30 layers of residuals costs more than recomputing them);
#   dots  save the matmul outputs without batch dimensions, recompute the rest.
REMAT_POLICIES = ("none", "full", "dots")

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Architecture hyper-parameters (Hugging Face `config.json` names)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int | None = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, Any], ...] | None = None  # hashable dict items
    tie_word_embeddings: bool = True
    attention_bias: bool = False  # Qwen2: biases on q, k, v
    max_position_embeddings: int = 2048
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    model_type: str = "llama"

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def rope_scaling_dict(self) -> dict[str, Any] | None:
        return dict(self.rope_scaling) if self.rope_scaling else None

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "LlamaConfig":
        """Builds a config from a Hugging Face `config.json` dictionary."""
        model_type = hf.get("model_type", "llama")
        rope_theta = hf.get("rope_theta")
        rope_scaling = hf.get("rope_scaling")
        parameters = hf.get("rope_parameters")  # transformers >= 5 layout
        if isinstance(parameters, dict):
            rope_theta = parameters.get("rope_theta", rope_theta)
            if parameters.get("rope_type", "default") != "default":
                rope_scaling = {k: v for k, v in parameters.items() if k != "rope_theta"}
        if isinstance(rope_scaling, dict) and rope_scaling.get(
            "rope_type", rope_scaling.get("type", "default")
        ) == "default":
            rope_scaling = None
        eos = hf.get("eos_token_id")
        if isinstance(eos, list):
            eos = tuple(eos)
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=hf["num_attention_heads"],
            num_key_value_heads=hf.get("num_key_value_heads", hf["num_attention_heads"]),
            head_dim=hf.get("head_dim"),
            rms_norm_eps=hf.get("rms_norm_eps", 1e-5),
            rope_theta=float(rope_theta if rope_theta is not None else 10000.0),
            rope_scaling=tuple(sorted(rope_scaling.items())) if rope_scaling else None,
            tie_word_embeddings=hf.get("tie_word_embeddings", model_type != "qwen2"),
            attention_bias=hf.get("attention_bias", model_type == "qwen2"),
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=eos,
            pad_token_id=hf.get("pad_token_id"),
            model_type=model_type,
        )

    def to_hf(self) -> dict[str, Any]:
        """The Hugging Face `config.json` dictionary of this config."""
        architectures = {"llama": ["LlamaForCausalLM"], "qwen2": ["Qwen2ForCausalLM"]}
        hf = {
            "architectures": architectures.get(self.model_type, ["LlamaForCausalLM"]),
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.dim_per_head,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling_dict,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "max_position_embeddings": self.max_position_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_id)
            if isinstance(self.eos_token_id, tuple)
            else self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "hidden_act": "silu",
        }
        return hf


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """LoRA placement: rank r, alpha (update scaled by alpha / r), targets."""

    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = ("q_proj", "v_proj")

    def __post_init__(self):
        unknown = set(self.targets) - set(LORA_TARGETS)
        if unknown:
            raise ValueError(f"unknown LoRA targets {sorted(unknown)}; choose from {LORA_TARGETS}")
        if self.rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {self.rank}")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


class KVCache(NamedTuple):
    """Per-layer keys `k [L, B, KV, S, D]` and values `v [L, B, KV, D, S]`;
    `index` = next free slot.

    Both are laid out with the dimension attention contracts over last (D
    for the scores q k^T, S for the weighted sum of values), the layout the
    matmul kernels read directly: any other one costs a transposed copy of
    every layer's cache on every decode step.  A uint16 cache holds the bit
    patterns of bfloat16 keys and values (`init_cache` makes one for a
    bfloat16 cache on CPU; `_cache_write` and `_cache_read` convert).
    """

    k: jax.Array
    v: jax.Array
    index: jax.Array  # int32 scalar

    @property
    def length(self) -> int:
        """Slots per row (S)."""
        return self.k.shape[3]


class ModelOutput(NamedTuple):
    """`logits [B, T, V]` (float32, or None), final-norm `hidden [B, T, H]`, cache."""

    logits: jax.Array | None
    hidden: jax.Array
    cache: KVCache | None


def init_cache(config: LlamaConfig, batch: int, length: int, dtype=jnp.float32) -> KVCache:
    """An empty KV cache of `length` slots for `batch` rows (layout: `KVCache`).

    A bfloat16 cache on CPU is stored as its uint16 bit pattern: XLA:CPU
    widens a bfloat16 dynamic-update-slice to float32, i.e. it would convert
    the whole cache twice on every write.
    """
    layers, kv, dim = config.num_hidden_layers, config.num_key_value_heads, config.dim_per_head
    if jnp.dtype(dtype) == jnp.bfloat16 and jax.default_backend() == "cpu":
        dtype = jnp.uint16
    keys = jnp.zeros((layers, batch, kv, length, dim), dtype)
    values = jnp.zeros((layers, batch, kv, dim, length), dtype)
    return KVCache(keys, values, jnp.zeros((), jnp.int32))


def _cache_write(cache: jax.Array, new: jax.Array, slot) -> jax.Array:
    """Writes `new` (one layer's block, in the cache's layout, with a leading
    layer axis of 1) into `cache` at index tuple `slot` (uint16 cache:
    bfloat16 bits)."""
    if cache.dtype == jnp.uint16:
        new = jax.lax.bitcast_convert_type(new.astype(jnp.bfloat16), jnp.uint16)
    else:
        new = new.astype(cache.dtype)
    return jax.lax.dynamic_update_slice(cache, new, slot)


def _cache_read(cache: jax.Array, layer) -> jax.Array:
    """Layer `layer`'s keys `[B, KV, S, D]` or values `[B, KV, D, S]`
    (bfloat16 for a uint16 cache)."""
    values = jax.lax.dynamic_index_in_dim(cache, layer, 0, keepdims=False)
    if cache.dtype == jnp.uint16:
        return jax.lax.bitcast_convert_type(values, jnp.bfloat16)
    return values


def _as_cached(x: jax.Array, cache_dtype, dtype) -> jax.Array:
    """`x` as a cache of `cache_dtype` would give it back, in `dtype`
    (uint16 cache: rounded to bfloat16)."""
    stored = jnp.bfloat16 if cache_dtype == jnp.uint16 else cache_dtype
    return x.astype(stored).astype(dtype)


# ---------------------------------------------------------------------------
# Pure building blocks.


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in float32."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * weight.astype(jnp.float32)).astype(x.dtype)


def rope_inverse_frequencies(config: LlamaConfig) -> jax.Array:
    """inv_freq[i] = theta^(-2i/D), adjusted by the config's RoPE scaling.

    Supported scaling: "linear" (positions / factor) and "llama3" (per-band
    wavelength scaling of Llama 3.1).
    """
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
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    x32 = x.astype(jnp.float32)
    x1, x2 = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x.dtype)


def attention_mask(key_mask: jax.Array, query_length: int, start: jax.Array) -> jax.Array:
    """`[B, T, S]` bool: query t sees key slot s iff s <= start + t and key_mask[b, s]."""
    slots = jnp.arange(key_mask.shape[1])
    query_slots = start + jnp.arange(query_length)
    causal = slots[None, :] <= query_slots[:, None]  # [T, S]
    return causal[None, :, :] & key_mask[:, None, :].astype(bool)


def _swap_einsum_spec(spec: str) -> tuple[str, str]:
    """The cotangent specs of a two-operand einsum "A,B->C": ("C,B->A", "A,C->B")."""
    inputs, out = spec.split("->")
    a, b = inputs.split(",")
    return f"{out},{b}->{a}", f"{a},{out}->{b}"


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3))
def mixed_einsum(spec: str, a: jax.Array, b: jax.Array, operand_dtype) -> jax.Array:
    """C = einsum(spec, a, b) with operands rounded to `operand_dtype`, accumulated in float32.

    Forward:  C = sum_k round(a) round(b)            (float32 accumulation)
    Backward: dA = einsum("C,B->A", round(dC), round(b)),
              dB = einsum("A,C->B", round(a), round(dC)),
    i.e. the backward matmuls take `operand_dtype` operands too (JAX's own
    transpose would pair a float32 cotangent with a bfloat16 operand, which
    XLA:CPU runs on its slow path).  With bfloat16 operands XLA:CPU uses the
    AMX/AVX-512-BF16 kernels: 3-4x the float32 matmul throughput on this CPU.
    Every index of each operand must appear in the other operand or the output
    (true for projections and attention), so the swapped specs are valid.
    """
    return jnp.einsum(
        spec, a.astype(operand_dtype), b.astype(operand_dtype), preferred_element_type=jnp.float32
    )


def _mixed_einsum_fwd(spec, a, b, operand_dtype):
    a_low, b_low = a.astype(operand_dtype), b.astype(operand_dtype)
    out = jnp.einsum(spec, a_low, b_low, preferred_element_type=jnp.float32)
    # Residuals must be arrays: two empty ones carry the primal dtypes.
    return out, (a_low, b_low, jnp.zeros((0,), a.dtype), jnp.zeros((0,), b.dtype))


def _mixed_einsum_bwd(spec, operand_dtype, residuals, grad):
    a_low, b_low, a_marker, b_marker = residuals
    grad_spec_a, grad_spec_b = _swap_einsum_spec(spec)
    grad_low = grad.astype(operand_dtype)
    grad_a = jnp.einsum(grad_spec_a, grad_low, b_low, preferred_element_type=jnp.float32)
    grad_b = jnp.einsum(grad_spec_b, a_low, grad_low, preferred_element_type=jnp.float32)
    return grad_a.astype(a_marker.dtype), grad_b.astype(b_marker.dtype)


mixed_einsum.defvjp(_mixed_einsum_fwd, _mixed_einsum_bwd)


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
    num_kv = k.shape[2]
    groups = num_heads // num_kv
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


def attention_over_cache(q, keys, values, mask, matmul_dtype=None):
    """`grouped_query_attention` over keys `[B, KV, S, D]` and values
    `[B, KV, D, S]` (the KV cache's layout, `KVCache`):

        out[b, t, (k, g)] = sum_s w[b, k, t, g, s] values[b, k, :, s],
        w[b, k, t, g] = softmax_s(q[b, t, (k, g)] . keys[b, k, s] / sqrt(D) + mask)

    q `[B, T, N, D]` with N = KV * groups, mask `[B, T, S]` -> `[B, T, N, D]`
    in q's dtype.  Both matmuls are plain batched matmuls over (b, k) with
    M = T * groups: at decode (T = 1) no operand needs a transposed copy,
    which at these sizes costs more than the matmuls (docs/performance.md).
    Operands are rounded to `matmul_dtype` when given (else taken in q's
    dtype), accumulation is float32.
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
    weights = _attention_weights(scores, mask[:, None, :, None, :])
    weights = weights.reshape(batch, num_kv, length * groups, slots).astype(operand_dtype)
    out = jax.lax.dot_general(weights, values.astype(operand_dtype), batched, preferred_element_type=jnp.float32)
    out = out.reshape(batch, num_kv, length, groups, dim).transpose(0, 2, 1, 3, 4)
    return out.reshape(batch, length, num_heads, dim).astype(dtype)


def _as_bits(x: jax.Array) -> jax.Array:
    """A 16-bit float array viewed as its uint16 bit pattern on CPU; other arrays unchanged.

    XLA:CPU supports bfloat16 only as matmul operands: it widens any other
    bfloat16 op, and for a dynamic slice or gather it widens the whole
    operand, i.e. converts every stacked layer weight (or the embedding) to
    float32 on each call.  Slicing and gathering the bit pattern, then
    reinterpreting the slice (`_from_bits`), keeps the weights 2 bytes wide
    (the bitcast of the stack is loop-invariant, so XLA hoists it out of a
    decode loop).  Not differentiable: only for frozen weights.
    """
    if x.dtype.itemsize == 2 and jnp.issubdtype(x.dtype, jnp.floating) and jax.default_backend() == "cpu":
        return _Bits(jax.lax.bitcast_convert_type(x, jnp.uint16), x.dtype)
    return x


@functools.partial(jax.tree_util.register_dataclass, data_fields=["bits"], meta_fields=["dtype"])
@dataclasses.dataclass(frozen=True)
class _Bits:
    """uint16 bits of a 16-bit float array and that array's dtype (see `_as_bits`)."""

    bits: jax.Array
    dtype: Any


def _from_bits(x) -> jax.Array:
    """Inverse of `_as_bits`."""
    if isinstance(x, _Bits):
        return jax.lax.bitcast_convert_type(x.bits, x.dtype)
    return x


# ---------------------------------------------------------------------------
# Modules.


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


class Llama(nnx.Module):
    """LLaMA / Qwen2 causal decoder with optional LoRA adapters.

    Call: `model(tokens [B, T], positions [B, T], key_mask [B, S], cache=None,
    use_lora=True, return_logits=True) -> ModelOutput`.  Without a cache
    S == T; with a cache S is the cache length and the new keys are written at
    slots `[cache.index, cache.index + T)`.

    Precision: activations (residual stream, norms, softmax) are in `dtype`;
    LoRA adapters, norms and biases are stored in `param_dtype`.  With
    `matmul_dtype=None` every matmul runs in `dtype` (exact float32 parity on
    CPU).  With `matmul_dtype=jnp.bfloat16` the base weight matrices (embedding,
    output layer, projections) are stored in bfloat16 and every large matmul
    (projections, attention, output layer) takes bfloat16 operands with
    float32 accumulation, forward and backward (`mixed_einsum`): half the
    weight memory and 3-4x the matmul speed on CPUs with AMX / AVX-512-BF16.
    The small LoRA matmuls stay in `dtype`.

    `remat` (one of `REMAT_POLICIES`) says what the backward pass of the
    layer scan saves; it changes memory and speed, not the result.

    `unstacked` (from `unstack_weights`, for inference): separate per-layer
    copies of the base weight matrices and the output layer as one `[H, V]`
    array.  The layers then run as an unrolled loop over those arrays instead
    of a scan over the stacked ones.  Same result; but a scan slices each
    layer's weights out of the stack, and XLA (CPU and GPU) materialises that
    slice as a copy before the matmul, so a memory-bound decode step reads and
    writes every weight twice more than it needs to (and XLA:CPU transposes
    a tied embedding for the output layer on every call).

    `empty_cache=True` (prefill): a promise that `cache` holds no keys yet
    (`cache.index == 0`).  Attention then runs over this call's own keys and
    values (rounded to the cache's dtype, so the numbers are those of
    attending over the cache) instead of over every slot of the cache, most
    of which are still empty: exact, and it skips their matmul and softmax
    work.  A broken promise gives NaN outputs, never silently wrong ones.

    `visibility` (`[B or 1, T, S]` bool): a further restriction of the
    attention rule (ANDed with it).  Packing several continuations of one
    prompt into one row uses it: each continuation sees the prompt and
    itself, not its siblings (`poad_jax.policy.shared_prompt_visibility`).
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
        positions: jax.Array,
        key_mask: jax.Array,
        cache: KVCache | None = None,
        *,
        use_lora: bool = True,
        return_logits: bool = True,
        unstacked: "UnstackedWeights | None" = None,
        empty_cache: bool = False,
        visibility: jax.Array | None = None,
    ) -> ModelOutput:
        config, dtype, matmul_dtype = self.config, self.dtype, self.matmul_dtype
        batch, length = tokens.shape
        chex.assert_shape(positions, (batch, length))
        chex.assert_rank(key_mask, 2)
        if cache is None:
            chex.assert_shape(key_mask, (batch, length))
            start = jnp.zeros((), jnp.int32)
        else:
            chex.assert_shape(key_mask, (batch, cache.length))
            start = cache.index
        mask = attention_mask(key_mask, length, start)
        if visibility is not None:
            mask = mask & visibility
        inv_freq = rope_inverse_frequencies(config)
        lora_on = use_lora and self.lora_config is not None and len(self.layers.lora_a) > 0
        lora_scale = self.lora_config.scale if self.lora_config is not None else 0.0

        layers = self.layers
        if unstacked is not None:
            chex.assert_equal(len(unstacked.layers), config.num_hidden_layers)
        stacked = {
            "input_norm": layers.input_norm[...],
            "post_attention_norm": layers.post_attention_norm[...],
            "weights": {} if unstacked is not None else {
                name: _as_bits(w[...]) for name, w in layers.weights.items()},
            "biases": {name: b[...] for name, b in layers.biases.items()},
            "lora_a": {name: a[...] for name, a in layers.lora_a.items()} if lora_on else {},
            "lora_b": {name: b[...] for name, b in layers.lora_b.items()} if lora_on else {},
        }
        n_heads, n_kv, head_dim = config.num_attention_heads, config.num_key_value_heads, config.dim_per_head

        def project(h, layer, name):
            weight = _from_bits(layer["weights"][name])
            if matmul_dtype is None:
                y = h @ weight.astype(dtype)
            else:
                y = mixed_einsum("bti,io->bto", h, weight, matmul_dtype).astype(dtype)
            if name in layer["biases"]:
                y = y + layer["biases"][name].astype(dtype)
            if name in layer["lora_a"]:
                a = layer["lora_a"][name].astype(dtype)
                b = layer["lora_b"][name].astype(dtype)
                y = y + ((h @ a) @ b) * jnp.asarray(lora_scale, dtype)
            return y

        def layer_step(carry, xs):
            x, cache_k, cache_v = carry
            layer, index = xs
            h = rms_norm(x, layer["input_norm"], config.rms_norm_eps)
            q = project(h, layer, "q_proj").reshape(batch, length, n_heads, head_dim)
            k = project(h, layer, "k_proj").reshape(batch, length, n_kv, head_dim)
            v = project(h, layer, "v_proj").reshape(batch, length, n_kv, head_dim)
            q = apply_rope(q, positions, inv_freq)
            k = apply_rope(k, positions, inv_freq)
            if cache_k is not None:
                # The whole cache rides in the scan carry and only the new slots
                # are written: XLA then updates it in place.  As scan xs/ys
                # (one slice per layer) it was copied whole on every decode step.
                k_block, v_block = jnp.swapaxes(k, 1, 2), jnp.transpose(v, (0, 2, 3, 1))  # cache layout
                cache_k = _cache_write(cache_k, k_block[None], (index, 0, 0, start, 0))
                cache_v = _cache_write(cache_v, v_block[None], (index, 0, 0, 0, start))
                if empty_cache:  # the cache holds just this call's keys: attend over them alone
                    attended = attention_over_cache(
                        q, _as_cached(k_block, cache_k.dtype, dtype), _as_cached(v_block, cache_v.dtype, dtype),
                        mask[:, :, :length], matmul_dtype,
                    )
                else:
                    attended = attention_over_cache(
                        q, _cache_read(cache_k, index), _cache_read(cache_v, index), mask, matmul_dtype
                    )
            else:
                attended = grouped_query_attention(q, k, v, mask, matmul_dtype)
            x = x + project(attended.reshape(batch, length, n_heads * head_dim), layer, "o_proj")
            h = rms_norm(x, layer["post_attention_norm"], config.rms_norm_eps)
            gated = jax.nn.silu(project(h, layer, "gate_proj")) * project(h, layer, "up_proj")
            x = x + project(gated, layer, "down_proj")
            return (x, cache_k, cache_v), None

        if self.remat == "full":
            layer_step = jax.checkpoint(layer_step, prevent_cse=False, policy=jax.checkpoint_policies.nothing_saveable)
        elif self.remat == "dots":
            layer_step = jax.checkpoint(
                layer_step, prevent_cse=False, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable
            )
        # Gather, then cast: never a cast copy of the table.
        table = _as_bits(self.embed[...])
        if isinstance(table, _Bits):
            x = _from_bits(_Bits(table.bits[tokens], table.dtype)).astype(dtype)
        else:
            x = table[tokens].astype(dtype)
        init = (x, cache.k, cache.v) if cache is not None else (x, None, None)
        if unstacked is None:
            (x, new_k, new_v), _ = jax.lax.scan(
                layer_step, init, (stacked, jnp.arange(config.num_hidden_layers, dtype=jnp.int32))
            )
        else:  # unrolled over separate per-layer weight arrays: no weight slice is copied
            carry = init
            for i, weights in enumerate(unstacked.layers):
                layer = jax.tree.map(lambda a, i=i: a[i], stacked)
                layer["weights"] = weights
                carry, _ = layer_step(carry, (layer, i))
            x, new_k, new_v = carry
        new_caches = (new_k, new_v)
        hidden = rms_norm(x, self.final_norm[...], config.rms_norm_eps)
        if empty_cache and cache is not None:  # a broken promise (cache not empty) gives NaN
            hidden = jnp.where(start == 0, hidden, jnp.nan)
        new_cache = None
        if cache is not None:
            new_cache = KVCache(new_caches[0], new_caches[1], cache.index + length)
        logits = self.logits(hidden, unstacked) if return_logits else None
        return ModelOutput(logits, hidden, new_cache)

    def logits(self, hidden: jax.Array, unstacked: "UnstackedWeights | None" = None) -> jax.Array:
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


class UnstackedWeights(NamedTuple):
    """Inference copies of the frozen base (`unstack_weights`): `layers[i]` maps
    each projection name to layer i's `[in, out]` matrix; `head` is the output
    layer `[H, V]`."""

    layers: tuple[dict[str, jax.Array], ...]
    head: jax.Array


def unstack_weights(model: Llama) -> UnstackedWeights:
    """Per-layer copies of the stacked base weight matrices, and the output
    layer as `[H, V]` (for `Llama.__call__(unstacked=)`).

    Costs one copy of the decoder's weight matrices (and of the embedding when
    it is tied); norms, biases and LoRA adapters stay stacked (they are small,
    and LoRA changes between updates).
    """
    stacked = {name: w[...] for name, w in model.layers.weights.items()}
    layers = tuple({name: w[i] for name, w in stacked.items()} for i in range(model.config.num_hidden_layers))
    head = model.lm_head[...] if model.lm_head is not None else jnp.transpose(model.embed[...])
    return UnstackedWeights(layers, head)


def merge_lora(model: Llama) -> None:
    """Folds the LoRA update into the base weights (W += scale * A @ B), in place.

    Afterwards B is zero, so the adapters-on forward equals the merged base.
    With bfloat16 base weights (`matmul_dtype`) the merged weights are rounded
    to bfloat16, which can erase a small LoRA update: merge into a float32
    model (load with `matmul_dtype=None`) to export merged weights.
    """
    if model.lora_config is None:
        return
    scale = model.lora_config.scale
    layers = model.layers
    for name in list(layers.lora_a.keys()):
        a, b = layers.lora_a[name][...], layers.lora_b[name][...]
        w = layers.weights[name]
        w[...] = (w[...] + scale * jnp.einsum("lir,lro->lio", a, b)).astype(w[...].dtype)
        layers.lora_b[name][...] = jnp.zeros_like(b)


def base_filter():
    """The frozen base weights: every `nnx.Param` that is not a `nnx.LoRAParam`."""
    return nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))
