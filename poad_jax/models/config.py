"""Architecture and LoRA hyper-parameters of a LLaMA-family model, and their
Hugging Face `config.json` form (`LlamaConfig.from_hf`, `to_hf`).  No JAX: `LoraConfig` is the
training config's `lora` section, and a config file loads without JAX."""

from __future__ import annotations

import dataclasses
from typing import Any

from poad_jax.declare import OneOf, above, at_least, hold_to_declarations, setting

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
    """LoRA placement (`config.lora`, declared here once, `poad_jax.declare`): rank r, alpha (the
    update scaled by alpha / r), targets."""

    rank: int = setting(8, "the adapters' rank r", at_least(1, "the adapter is what training changes"))
    alpha: float = setting(16.0, "LoRA's scale: the update is alpha / rank x B A", above(0))
    targets: tuple[str, ...] = setting(("q_proj", "v_proj"), "the projections that carry adapters",
                                       OneOf(lambda: LORA_TARGETS, many=True))

    def __post_init__(self):
        hold_to_declarations(self)

    @property
    def scale(self) -> float:
        return self.alpha / self.rank
