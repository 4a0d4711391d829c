"""The Flax LLaMA/Qwen2 model against a plain NumPy forward pass, KV cache and LoRA.

A tiny random-weight checkpoint is written in Hugging Face format
(config.json + model.safetensors), loaded back with `hf_io.load_hf_model`, and
its logits compared with `numpy_logits`, an independent float64
implementation of the transformers LLaMA/Qwen2 forward written here.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from poad_jax.models import LlamaConfig, LoraConfig, init_cache
from poad_jax.models import hf_io
from poad_jax.models.decode import attention_over_cache, unstack_weights
from poad_jax.models.llama import grouped_query_attention
from poad_jax.models.lora import merge_lora

TOLERANCE = 2e-5  # float32 model vs float64 reference, logits of order 1


def tiny_hf_config(model_type: str) -> dict:
    qwen = model_type == "qwen2"
    return {
        "model_type": model_type,
        "vocab_size": 61,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6 if qwen else 1e-5,
        "rope_theta": 1e6 if qwen else 1e4,
        "tie_word_embeddings": not qwen,
        "attention_bias": qwen,
        "max_position_embeddings": 128,
        "eos_token_id": 0,
    }


def random_hf_tensors(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """HF-named float32 weights, scaled so activations stay of order one."""
    rng = np.random.default_rng(seed)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = hidden // config["num_attention_heads"]
    q_out = config["num_attention_heads"] * head_dim
    kv_out = config["num_key_value_heads"] * head_dim

    def linear(out_dim, in_dim):
        return (rng.standard_normal((out_dim, in_dim)) / np.sqrt(in_dim)).astype(np.float32)

    def norm(size):
        return (1.0 + 0.2 * rng.standard_normal(size)).astype(np.float32)

    tensors = {
        "model.embed_tokens.weight": rng.standard_normal((config["vocab_size"], hidden)).astype(np.float32),
        "model.norm.weight": norm(hidden),
    }
    if not config["tie_word_embeddings"]:
        tensors["lm_head.weight"] = linear(config["vocab_size"], hidden)
    for i in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{i}."
        tensors[prefix + "input_layernorm.weight"] = norm(hidden)
        tensors[prefix + "post_attention_layernorm.weight"] = norm(hidden)
        for name, shape in {
            "self_attn.q_proj": (q_out, hidden),
            "self_attn.k_proj": (kv_out, hidden),
            "self_attn.v_proj": (kv_out, hidden),
            "self_attn.o_proj": (hidden, q_out),
            "mlp.gate_proj": (inter, hidden),
            "mlp.up_proj": (inter, hidden),
            "mlp.down_proj": (hidden, inter),
        }.items():
            tensors[prefix + name + ".weight"] = linear(*shape)
        if config["attention_bias"]:
            for name, size in (("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)):
                tensors[prefix + f"self_attn.{name}.bias"] = (0.3 * rng.standard_normal(size)).astype(np.float32)
    return tensors


def numpy_logits(config: dict, tensors: dict[str, np.ndarray], tokens: np.ndarray) -> np.ndarray:
    """transformers' LLaMA/Qwen2 forward in float64 NumPy: `tokens [T]` -> logits `[T, V]`."""
    w = {name: value.astype(np.float64) for name, value in tensors.items()}
    n_heads, n_kv = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config["hidden_size"] // n_heads
    eps = config["rms_norm_eps"]
    length = len(tokens)

    def rms(x, weight):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight

    inv_freq = 1.0 / config["rope_theta"] ** (np.arange(0, head_dim, 2) / head_dim)
    angles = np.arange(length)[:, None] * inv_freq[None, :]  # [T, D/2]
    cos = np.concatenate([np.cos(angles)] * 2, axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(angles)] * 2, axis=-1)[:, None, :]

    def rope(x):  # [T, N, D], rotate half
        half = head_dim // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rotated * sin

    def linear(x, prefix, name):
        y = x @ w[f"{prefix}{name}.weight"].T
        bias = w.get(f"{prefix}{name}.bias")
        return y if bias is None else y + bias

    x = w["model.embed_tokens.weight"][tokens]
    causal = np.tril(np.ones((length, length), bool))
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = rope(linear(h, p, "self_attn.q_proj").reshape(length, n_heads, head_dim))
        k = rope(linear(h, p, "self_attn.k_proj").reshape(length, n_kv, head_dim))
        v = linear(h, p, "self_attn.v_proj").reshape(length, n_kv, head_dim)
        k = np.repeat(k, n_heads // n_kv, axis=1)
        v = np.repeat(v, n_heads // n_kv, axis=1)
        scores = np.einsum("tnd,snd->nts", q, k) / np.sqrt(head_dim)
        scores = np.where(causal[None], scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attended = np.einsum("nts,snd->tnd", probs, v).reshape(length, n_heads * head_dim)
        x = x + linear(attended, p, "self_attn.o_proj")
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        gate = linear(h, p, "mlp.gate_proj")
        x = x + linear(gate / (1.0 + np.exp(-gate)) * linear(h, p, "mlp.up_proj"), p, "mlp.down_proj")
    x = rms(x, w["model.norm.weight"])
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return x @ head.T


@functools.partial(nnx.jit, static_argnames=("use_lora",))
def _jit_forward(model, tokens, positions, key_mask, cache, use_lora):
    out = model(tokens, positions, key_mask, cache, use_lora=use_lora)
    return out.logits, out.cache


def forward(model, tokens, positions, key_mask, cache=None, use_lora=True):
    """`(logits, cache)` of `model(...)`, compiled (one compilation per shape and structure)."""
    args = (jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(key_mask), cache)
    logits, cache = _jit_forward(model, *args, use_lora=use_lora)
    return np.asarray(logits), cache


def full_logits(model, tokens: np.ndarray, use_lora: bool = True) -> np.ndarray:
    """Logits `[B, T, V]` of one cache-less forward over unpadded rows."""
    tokens = np.atleast_2d(tokens)
    batch, length = tokens.shape
    positions = np.broadcast_to(np.arange(length), (batch, length))
    return forward(model, tokens, positions, np.ones((batch, length), bool), use_lora=use_lora)[0]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny_checkpoint(request, tmp_path_factory):
    """`(hf_config, hf_tensors, directory)` of a tiny random checkpoint saved in HF format."""
    config = tiny_hf_config(request.param)
    tensors = random_hf_tensors(config, seed=1 if request.param == "qwen2" else 0)
    directory = tmp_path_factory.mktemp(f"tiny_{request.param}")
    hf_io.write_hf_checkpoint(directory, config, tensors)
    return config, tensors, directory


TOKENS = np.array([3, 17, 42, 5, 60, 8, 8, 29, 1, 33, 12])


def test_reloaded_hf_checkpoint_matches_numpy_forward(tiny_checkpoint):
    config, tensors, directory = tiny_checkpoint
    model = hf_io.load_hf_model(directory, lora=None)
    assert (model.lm_head is None) == config["tie_word_embeddings"]
    expected = numpy_logits(config, tensors, TOKENS)
    got = full_logits(model, TOKENS)[0]
    np.testing.assert_allclose(got, expected, atol=TOLERANCE, rtol=0)
    assert np.abs(expected).max() > 1.0  # a non-trivial comparison


def test_export_and_reload_round_trips(tiny_checkpoint, tmp_path):
    config, tensors, directory = tiny_checkpoint
    model = hf_io.load_hf_model(directory, lora=None)
    exported = hf_io.hf_tensors_of_model(model)
    assert set(exported) == set(tensors)
    for name, value in tensors.items():
        np.testing.assert_array_equal(exported[name], value, err_msg=name)
    hf_io.save_hf_model(tmp_path, model)
    again = hf_io.load_hf_model(tmp_path, lora=None)
    np.testing.assert_array_equal(full_logits(again, TOKENS), full_logits(model, TOKENS))


def test_kv_cache_decoding_equals_full_forward_with_left_padding(tiny_checkpoint):
    """Row 0: the 11 tokens; row 1: 3 pad slots then the first 8 (same positions 0..7).

    Prefill 6 slots through the cache, then decode the rest one slot at a time;
    every valid position's logits must equal the cache-less forward's.
    """
    config, _, directory = tiny_checkpoint
    model = hf_io.load_hf_model(directory, lora=None)
    pad = 3
    tokens = np.stack([TOKENS, np.concatenate([np.zeros(pad, int), TOKENS[:-pad]])])
    key_mask = np.ones(tokens.shape, bool)
    key_mask[1, :pad] = False
    positions = np.stack([np.arange(11), np.maximum(np.arange(11) - pad, 0)])
    full, _ = forward(model, tokens, positions, key_mask)

    cache = init_cache(model.config, batch=2, length=16)
    cache_mask = np.zeros((2, 16), bool)
    cache_mask[:, :11] = key_mask
    prefill = 6
    logits, cache = forward(model, tokens[:, :prefill], positions[:, :prefill], cache_mask, cache)
    pieces = [logits]
    for t in range(prefill, 11):
        logits, cache = forward(model, tokens[:, t : t + 1], positions[:, t : t + 1], cache_mask, cache)
        pieces.append(logits)
    assert int(cache.index) == 11
    cached = np.concatenate(pieces, axis=1)
    np.testing.assert_allclose(cached[0], full[0], atol=1e-5, rtol=0)
    np.testing.assert_allclose(cached[1, pad:], full[1, pad:], atol=1e-5, rtol=0)
    # and the padded row equals the unpadded sequence on its own
    alone = full_logits(model, TOKENS[:-pad])[0]
    np.testing.assert_allclose(cached[1, pad:], alone, atol=1e-5, rtol=0)


def _randomise_lora_b(model, seed=0):
    key = jax.random.key(seed)
    for name, b in model.layers.lora_b.items():
        key, sub = jax.random.split(key)
        b[...] = 0.05 * jax.random.normal(sub, b[...].shape, b[...].dtype)


def test_fresh_lora_changes_no_logit_and_trained_lora_does(tiny_checkpoint):
    _, _, directory = tiny_checkpoint
    lora = LoraConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj", "down_proj"))
    model = hf_io.load_hf_model(directory, lora=lora)
    base = hf_io.load_hf_model(directory, lora=None)
    assert len(nnx.state(model, nnx.LoRAParam)) > 0
    np.testing.assert_array_equal(full_logits(model, TOKENS), full_logits(base, TOKENS))
    _randomise_lora_b(model)
    adapted = full_logits(model, TOKENS)
    assert np.abs(adapted - full_logits(base, TOKENS)).max() > 1e-3
    # adapters off == the frozen base, whatever the adapters hold
    np.testing.assert_array_equal(full_logits(model, TOKENS, use_lora=False), full_logits(base, TOKENS))


def test_merge_lora_equals_adapters_on(tiny_checkpoint):
    _, _, directory = tiny_checkpoint
    model = hf_io.load_hf_model(directory, lora=LoraConfig(rank=4, alpha=16.0))
    _randomise_lora_b(model, seed=3)
    adapters_on = full_logits(model, TOKENS)
    merge_lora(model)
    np.testing.assert_allclose(full_logits(model, TOKENS, use_lora=False), adapters_on, atol=1e-5, rtol=0)
    np.testing.assert_allclose(full_logits(model, TOKENS, use_lora=True), adapters_on, atol=1e-5, rtol=0)


def test_config_round_trips_through_hf_dict():
    for model_type in ("llama", "qwen2"):
        config = LlamaConfig.from_hf(tiny_hf_config(model_type))
        assert LlamaConfig.from_hf(config.to_hf()).to_hf() == config.to_hf()
        assert config.attention_bias == (model_type == "qwen2")


def numpy_attention_over_cache(q, keys, values, mask):
    """Grouped-query attention in float64: q `[B, T, N, D]`, keys `[B, KV, S, D]`,
    values `[B, KV, D, S]`, mask `[B, T, S]`; a query that sees no key gets zeros."""
    q, keys, values = (np.asarray(a, np.float64) for a in (q, keys, values))
    groups = q.shape[2] // keys.shape[1]
    keys = np.repeat(keys, groups, axis=1)  # [B, N, S, D], head n uses KV head n // groups
    values = np.repeat(values, groups, axis=1)  # [B, N, D, S]
    scores = np.einsum("btnd,bnsd->bnts", q, keys) / np.sqrt(q.shape[-1])
    visible = np.asarray(mask, bool)[:, None]
    scores = np.where(visible, scores, -np.inf)
    top = np.max(scores, axis=-1, keepdims=True)
    probs = np.where(visible, np.exp(scores - np.where(np.isfinite(top), top, 0.0)), 0.0)
    total = probs.sum(-1, keepdims=True)
    probs = probs / np.where(total > 0, total, 1.0)
    return np.einsum("bnts,bnds->btnd", probs, values)


@pytest.mark.parametrize("length", [1, 3])
def test_attention_over_cache_matches_numpy_and_the_cacheless_attention(length):
    """The cache-layout attention (keys `[B, KV, S, D]`, values `[B, KV, D, S]`)
    against a float64 NumPy reference, including a query that sees no key;
    and with bfloat16 operands, against `grouped_query_attention` on the same
    keys and values in its `[B, S, KV, D]` layout (same rounding points)."""
    batch, n_heads, n_kv, slots, dim = 3, 6, 2, 7, 8
    rng = np.random.default_rng(length)
    q = rng.standard_normal((batch, length, n_heads, dim)).astype(np.float32)
    keys = rng.standard_normal((batch, n_kv, slots, dim)).astype(np.float32)
    values = rng.standard_normal((batch, n_kv, dim, slots)).astype(np.float32)
    mask = rng.random((batch, length, slots)) < 0.6
    mask[0, 0] = False  # sees nothing: zeros
    mask[1:, :, 0] = True  # every other query sees at least one key
    ours = jax.jit(attention_over_cache, static_argnums=4)
    out = np.asarray(ours(q, keys, values, mask, None))
    assert out.shape == (batch, length, n_heads, dim)
    np.testing.assert_allclose(out, numpy_attention_over_cache(q, keys, values, mask), atol=2e-6, rtol=0)
    np.testing.assert_array_equal(out[0, 0], 0.0)

    low = np.asarray(ours(q, keys, values, mask, jnp.bfloat16))
    cacheless = grouped_query_attention(q, np.swapaxes(keys, 1, 2), np.transpose(values, (0, 3, 1, 2)), mask, jnp.bfloat16)
    np.testing.assert_allclose(low, np.asarray(cacheless), atol=1e-6, rtol=0)
    assert np.max(np.abs(low - out)) > 1e-4  # bfloat16 operands really were rounded


@pytest.mark.long
@pytest.mark.parametrize("use_cache", [False, True])
def test_unstacked_weights_give_the_scanned_forward(tiny_checkpoint, use_cache):
    """`unstack_weights` + the unrolled layer loop = the scan over stacked weights,
    with LoRA adapters on (they stay stacked) and with or without a KV cache."""
    _, _, directory = tiny_checkpoint
    model = hf_io.load_hf_model(directory, lora=LoraConfig(rank=4, targets=("q_proj", "v_proj", "up_proj")))
    _randomise_lora_b(model, seed=5)
    unstacked = unstack_weights(model)
    assert len(unstacked.layers) == model.config.num_hidden_layers
    assert unstacked.head.shape == (model.config.hidden_size, model.config.vocab_size)
    np.testing.assert_array_equal(unstacked.layers[1]["down_proj"], model.layers.weights["down_proj"][...][1])
    tokens = np.stack([TOKENS, TOKENS[::-1]])
    positions = np.broadcast_to(np.arange(len(TOKENS)), tokens.shape)
    mask = np.ones(tokens.shape, bool)
    cache = init_cache(model.config, batch=2, length=len(TOKENS)) if use_cache else None
    scanned = model(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask), cache)
    unrolled = model(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask), cache, unstacked=unstacked)
    np.testing.assert_allclose(unrolled.logits, scanned.logits, atol=1e-5, rtol=0)
    np.testing.assert_allclose(unrolled.hidden, scanned.hidden, atol=1e-5, rtol=0)
    if use_cache:
        np.testing.assert_allclose(unrolled.cache.k, scanned.cache.k, atol=1e-5, rtol=0)
        np.testing.assert_allclose(unrolled.cache.v, scanned.cache.v, atol=1e-5, rtol=0)
    # a wrong number of layers is refused
    with pytest.raises(AssertionError):
        model(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask),
              unstacked=unstacked._replace(layers=unstacked.layers[:1]))


@pytest.mark.long
@pytest.mark.parametrize("cache_dtype", [jnp.float32, jnp.bfloat16])
def test_prefill_into_an_empty_cache_attends_over_its_own_keys_alone(tiny_checkpoint, cache_dtype):
    """`empty_cache=True` (attention over the call's own keys, rounded to the
    cache's dtype) = attention over every slot of the cache, with left padding
    and a cache longer than the prompt; the cache written is the same; and on a
    cache that is not empty the promise is broken, which gives NaN."""
    _, _, directory = tiny_checkpoint
    model = hf_io.load_hf_model(directory, lora=LoraConfig(rank=4))
    _randomise_lora_b(model, seed=3)
    pad = 3
    tokens = jnp.asarray(np.stack([TOKENS, np.concatenate([np.zeros(pad, int), TOKENS[:-pad]])]))
    key_mask = np.ones((2, 16), bool)
    key_mask[1, :pad] = False
    positions = jnp.asarray(np.stack([np.arange(11), np.maximum(np.arange(11) - pad, 0)]))
    cache = init_cache(model.config, batch=2, length=16, dtype=cache_dtype)
    every_slot = model(tokens, positions, jnp.asarray(key_mask), cache)
    own_keys = model(tokens, positions, jnp.asarray(key_mask), cache, empty_cache=True)
    np.testing.assert_allclose(own_keys.logits[0], every_slot.logits[0], atol=1e-5, rtol=0)
    np.testing.assert_allclose(own_keys.logits[1, pad:], every_slot.logits[1, pad:], atol=1e-5, rtol=0)
    for ours, theirs in ((own_keys.cache.k, every_slot.cache.k), (own_keys.cache.v, every_slot.cache.v)):
        ours, theirs = np.asarray(ours), np.asarray(theirs)
        if ours.dtype == np.uint16:  # bfloat16 bits
            ours, theirs = (np.asarray(jax.lax.bitcast_convert_type(a, jnp.bfloat16), np.float32) for a in (ours, theirs))
        np.testing.assert_array_equal(ours[0], theirs[0])  # layer 0 sees the same inputs: same keys exactly
        np.testing.assert_allclose(ours[:, 0], theirs[:, 0], atol=1e-5, rtol=2.0**-7 if cache_dtype == jnp.bfloat16 else 0)
    assert int(own_keys.cache.index) == 11
    # the next token, decoded on top of either prefill, agrees
    step = (tokens[:, :1], positions[:, -1:] + 1, jnp.asarray(key_mask))
    np.testing.assert_allclose(model(*step, own_keys.cache).logits, model(*step, every_slot.cache).logits,
                               atol=1e-5, rtol=0)
    broken = model(*step, own_keys.cache, empty_cache=True)
    assert np.all(np.isnan(broken.logits))


@pytest.mark.long
def test_one_line_forward_uses_arange_positions_and_an_all_ones_mask(tiny_checkpoint):
    """`model(tokens)` = the explicit call with positions 0..T-1 and every key visible;
    with a cache, positions continue from `cache.index` and every slot is a real key."""
    _, _, directory = tiny_checkpoint
    model = hf_io.load_hf_model(directory, lora=LoraConfig(rank=4))
    _randomise_lora_b(model, seed=7)
    tokens = jnp.asarray(np.stack([TOKENS, TOKENS[::-1]]))
    positions = jnp.broadcast_to(jnp.arange(len(TOKENS)), tokens.shape)
    explicit = model(tokens, positions, jnp.ones(tokens.shape, bool))
    np.testing.assert_array_equal(model(tokens).logits, explicit.logits)
    cache = init_cache(model.config, batch=2, length=16)
    first = model(tokens[:, :6])
    cached = model(tokens[:, 6:], cache=model(tokens[:, :6], cache=cache).cache)
    np.testing.assert_allclose(cached.logits, explicit.logits[:, 6:], atol=1e-5, rtol=0)
    np.testing.assert_array_equal(first.logits, model(tokens[:, :6], positions[:, :6], jnp.ones((2, 6), bool)).logits)
