"""Mixed-precision matmuls (`mixed_einsum`, `matmul_dtype`) and layer rematerialisation.

`mixed_einsum` is checked against a float64 NumPy einsum of bfloat16-rounded
operands (forward) and of the rounded cotangent (backward); a model with
bfloat16 matmuls against the float64 NumPy forward of `test_models_llama`;
the remat policies against each other (they must not change a gradient).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

from poad_jax.models import LoraConfig, hf_io
from poad_jax.models.llama import REMAT_POLICIES, Llama, LlamaConfig, mixed_einsum
from poad_jax.models.decode import init_cache
from test_models_llama import TOKENS, forward, full_logits, numpy_logits, tiny_checkpoint  # noqa: F401

SPECS = {
    # spec: (shape of a, shape of b), as the model uses them
    "bti,io->bto": ((2, 5, 12), (12, 7)),
    "btkgd,bskd->bkgts": ((2, 5, 2, 3, 8), (2, 6, 2, 8)),
    "bkgts,bskd->btkgd": ((2, 2, 3, 5, 6), (2, 6, 2, 8)),
    "...h,vh->...v": ((2, 5, 12), (31, 12)),
}


def bf16_rounded(x) -> np.ndarray:
    """x rounded to bfloat16 (round to nearest even), as float64."""
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def random_operands(spec: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    shape_a, shape_b = SPECS[spec]
    return rng.standard_normal(shape_a).astype(np.float32), rng.standard_normal(shape_b).astype(np.float32)


@pytest.mark.parametrize("spec", list(SPECS))
def test_mixed_einsum_forward_is_float32_accumulation_of_rounded_operands(spec):
    a, b = random_operands(spec)
    out = np.asarray(jax.jit(mixed_einsum, static_argnums=(0, 3))(spec, a, b, jnp.bfloat16))
    assert out.dtype == np.float32
    expected = np.einsum(spec, bf16_rounded(a), bf16_rounded(b))
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    exact = np.einsum(spec, a.astype(np.float64), b.astype(np.float64))
    assert np.abs(out - exact).max() > 1e-4  # the rounding is really there (the test can tell)


@pytest.mark.parametrize("spec", list(SPECS))
def test_mixed_einsum_gradients_use_rounded_cotangents(spec):
    """dA = einsum("C,B->A", round(G), round(b)), dB = einsum("A,C->B", round(a), round(G))."""
    a, b = random_operands(spec, seed=1)
    cotangent = np.random.default_rng(2).standard_normal(np.einsum(spec, a, b).shape).astype(np.float32)

    def objective(a, b):
        return jnp.sum(mixed_einsum(spec, a, b, jnp.bfloat16) * cotangent)

    grad_a, grad_b = jax.jit(jax.grad(objective, argnums=(0, 1)))(a, b)
    assert grad_a.dtype == np.float32 and grad_b.dtype == np.float32
    inputs, out = spec.replace("...", "xy").split("->")  # NumPy cannot sum over an ellipsis
    spec_a, spec_b = inputs.split(",")
    expected_a = np.einsum(f"{out},{spec_b}->{spec_a}", bf16_rounded(cotangent), bf16_rounded(b))
    expected_b = np.einsum(f"{spec_a},{out}->{spec_b}", bf16_rounded(a), bf16_rounded(cotangent))
    np.testing.assert_allclose(np.asarray(grad_a), expected_a, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(grad_b), expected_b, rtol=1e-5, atol=1e-5)


def test_bfloat16_matmul_model_stays_close_to_the_float64_reference(tiny_checkpoint):  # noqa: F811
    config, tensors, directory = tiny_checkpoint
    model = hf_io.load_hf_model(directory, matmul_dtype=jnp.bfloat16)
    weights = model.layers.weights
    assert model.embed[...].dtype == jnp.bfloat16 and weights["q_proj"][...].dtype == jnp.bfloat16
    assert model.layers.input_norm[...].dtype == jnp.float32  # norms, biases and LoRA stay float32
    assert model.layers.lora_a["q_proj"][...].dtype == jnp.float32
    logits = full_logits(model, TOKENS)[0]
    expected = numpy_logits(config, tensors, TOKENS)
    error = np.abs(logits - expected).max()
    assert error < 0.05 * np.abs(expected).max()
    exact = full_logits(hf_io.load_hf_model(directory), TOKENS)[0]
    assert np.abs(exact - expected).max() < error  # float32 is closer: bfloat16 really was used


def lora_gradients(model: Llama) -> dict:
    """Gradients of a fixed linear function of the logits w.r.t. the LoRA parameters."""
    tokens = jnp.asarray(TOKENS)[None]
    positions = jnp.arange(tokens.shape[1])[None]
    key_mask = jnp.ones(tokens.shape, bool)
    graph, lora, rest = nnx.split(model, nnx.LoRAParam, ...)
    weights = jax.random.normal(jax.random.key(3), (tokens.shape[1], model.config.vocab_size))

    @jax.jit
    def grads(lora):
        def objective(lora):
            logits = nnx.merge(graph, lora, rest)(tokens, positions, key_mask).logits[0]
            return jnp.sum(jax.nn.log_softmax(logits) * weights)

        return jax.grad(objective)(lora)

    # Non-zero B so that A gets a gradient too.
    lora = jax.tree.map(lambda x: x + 0.1 * jax.random.normal(jax.random.key(4), x.shape, x.dtype), lora)
    return jax.tree.map(np.asarray, nnx.to_pure_dict(grads(lora)))


@pytest.mark.long
def test_remat_policies_change_no_gradient(tiny_checkpoint):  # noqa: F811
    _, _, directory = tiny_checkpoint
    lora = LoraConfig(rank=4, targets=("q_proj", "v_proj", "down_proj"))
    results = {
        remat: lora_gradients(hf_io.load_hf_model(directory, lora=lora, remat=remat)) for remat in REMAT_POLICIES
    }
    reference = jax.tree.leaves(results["none"])
    assert max(np.abs(leaf).max() for leaf in reference) > 1e-3
    # XLA:GPU fuses a recomputed layer differently, so its reductions sum in
    # another order: float32 rounding differences up to ~1e-4 relative (and
    # ~2e-5 absolute on small entries) there, seen on an H100.
    rtol, atol = (1e-5, 1e-6) if jax.default_backend() == "cpu" else (3e-4, 5e-5)
    for remat in REMAT_POLICIES:
        for got, expected in zip(jax.tree.leaves(results[remat]), reference):
            np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, err_msg=remat)


@pytest.mark.long
def test_bfloat16_matmul_gradients_point_the_same_way(tiny_checkpoint):  # noqa: F811
    _, _, directory = tiny_checkpoint
    lora = LoraConfig(rank=4)
    exact = jax.tree.leaves(lora_gradients(hf_io.load_hf_model(directory, lora=lora)))
    mixed = jax.tree.leaves(lora_gradients(hf_io.load_hf_model(directory, lora=lora, matmul_dtype=jnp.bfloat16)))
    for got, expected in zip(mixed, exact):
        cosine = np.sum(got * expected) / (np.linalg.norm(got) * np.linalg.norm(expected))
        assert cosine > 0.99
        assert not np.array_equal(got, expected)


def test_unknown_remat_policy_is_refused():
    config = LlamaConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    with pytest.raises(ValueError, match="remat must be one of"):
        Llama(config, remat="some", rngs=nnx.Rngs(0))


@pytest.mark.long
def test_bfloat16_cache_changes_no_logit_with_bfloat16_matmuls(tiny_checkpoint):  # noqa: F811
    """With bfloat16 matmuls attention rounds keys and values to bfloat16, so
    caching them in bfloat16 (as uint16 bits on CPU) gives the float32 cache's
    logits exactly; the sampler uses such a cache by default then."""
    _, _, directory = tiny_checkpoint
    model = hf_io.load_hf_model(directory, lora=None, matmul_dtype=jnp.bfloat16)
    batch, length = 2, len(TOKENS)
    tokens = np.stack([TOKENS, TOKENS[::-1]])
    positions = np.broadcast_to(np.arange(length), (batch, length))
    results = {}
    for dtype in (jnp.float32, jnp.bfloat16):
        cache = init_cache(model.config, batch=batch, length=16, dtype=dtype)
        expected_storage = jnp.uint16 if dtype == jnp.bfloat16 and jax.default_backend() == "cpu" else dtype
        assert cache.k.dtype == expected_storage and cache.v.dtype == expected_storage
        mask = np.zeros((batch, 16), bool)
        mask[:, :length] = True
        pieces = []
        logits, cache = forward(model, tokens[:, :6], positions[:, :6], mask, cache)
        pieces.append(logits)
        for t in range(6, length):
            logits, cache = forward(model, tokens[:, t:t + 1], positions[:, t:t + 1], mask, cache)
            pieces.append(logits)
        assert cache.k.dtype == expected_storage
        results[dtype] = np.concatenate(pieces, axis=1)
    np.testing.assert_array_equal(results[jnp.bfloat16], results[jnp.float32])
    # and both agree with the cache-less forward to bfloat16-matmul accuracy
    np.testing.assert_allclose(results[jnp.float32], full_logits(model, tokens), atol=2e-2, rtol=0)
