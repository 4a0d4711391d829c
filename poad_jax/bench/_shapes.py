"""Model shapes the benchmarks can build with random weights (no download).

Weight values do not change speed, so a random model of a real model's
shapes measures what that model would; `build_random_model` builds one in
memory on the default device.
"""

from __future__ import annotations

SMOLLM2_SHAPES = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    rope_theta=100000.0,
    tie_word_embeddings=True,
    max_position_embeddings=8192,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)

LLAMA_7B_SHAPES = dict(
    vocab_size=32000,
    hidden_size=4096,
    intermediate_size=11008,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=32,
    head_dim=128,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    max_position_embeddings=4096,
)

# Qwen2.5-Coder-0.5B-Instruct as `poad_jax.models.load` converts the embedded GGUF
# (configs/datasci_qwen.py's model): its output layer is a separate matrix, not the embedding.
QWEN_CODER_05B_SHAPES = dict(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    head_dim=64,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    tie_word_embeddings=False,
    attention_bias=True,
    max_position_embeddings=32768,
    bos_token_id=151643,
    eos_token_id=151645,
    pad_token_id=151643,
    model_type="qwen2",
)

SHAPES = {"smollm2-135m": SMOLLM2_SHAPES, "llama-7b": LLAMA_7B_SHAPES, "qwen2.5-coder-0.5b": QWEN_CODER_05B_SHAPES}


def build_random_model(shape: str, *, lora, dtype, matmul_dtype, remat: str = "full"):
    """A `Llama` of `SHAPES[shape]` with random weights (parameters in `dtype`)."""
    from flax import nnx

    from poad_jax.models.llama import Llama, LlamaConfig

    return Llama(LlamaConfig(**SHAPES[shape]), lora=lora, dtype=dtype, param_dtype=dtype,
                 matmul_dtype=matmul_dtype, remat=remat, rngs=nnx.Rngs(0))
