"""`python -m poad_jax.bench generate`: the bytes a decode step reads and the memory floor."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import pytest
from flax import nnx

from poad_jax.bench.generate import memory_floor, weight_bytes
from poad_jax.core.flops import decoder_weights
from poad_jax.models.config import LlamaConfig, LoraConfig
from poad_jax.models.llama import Llama

UNTIED = LlamaConfig(vocab_size=50, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)


@pytest.mark.parametrize("matmul_dtype", [None, jnp.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_weight_bytes_are_the_weights_a_decode_step_reads(matmul_dtype, tied):
    """Decoder matrices and the output layer [H, V] (or the tied embedding, the same size) in the
    matmul dtype, the 2 L + 1 norms [H] in float32; not LoRA, not an untied input embedding."""
    config = dataclasses.replace(UNTIED, tie_word_embeddings=tied)
    model = Llama(config, lora=LoraConfig(rank=2), matmul_dtype=matmul_dtype, rngs=nnx.Rngs(0))
    matrices = decoder_weights(config) + config.hidden_size * config.vocab_size
    norms = (2 * config.num_hidden_layers + 1) * config.hidden_size
    assert weight_bytes(model) == (2 if matmul_dtype else 4) * matrices + 4 * norms


def test_memory_floor_is_bytes_over_the_measured_bandwidth():
    floor = memory_floor(decode_step_s=0.1, weight_bytes=10**9, decode_bytes=2 * 10**9, read_gbs=20.0)
    assert floor["floor_ms"] == pytest.approx(50.0)  # 1 GB at 20 GB/s
    assert floor["over_floor"] == pytest.approx(2.0)
    assert floor["floor_with_cache_ms"] == pytest.approx(100.0)
    assert floor["over_floor_with_cache"] == pytest.approx(1.0)
