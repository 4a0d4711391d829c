"""Hugging Face checkpoint directories <-> `Llama` (safetensors via `safetensors.numpy`).

A directory holds `config.json`, the weights (`model.safetensors`, or shards
listed in `model.safetensors.index.json`) and the tokenizer files.  Names and
layouts are transformers' (`model.layers.N.self_attn.q_proj.weight`,
`[out, in]`); `Llama` stores linear weights `[in, out]` stacked over layers
`[L, in, out]`, so every linear weight is transposed on the way in and out.
Tied checkpoints have no `lm_head.weight` (the model reuses `embed`).
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from poad_jax.models.errors import ModelLoadError
from poad_jax.models.llama import Llama, LlamaConfig, LoraConfig

ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
SUPPORTED_MODEL_TYPES = ("llama", "qwen2")


def hf_weight_name(layer: int, projection: str, kind: str = "weight") -> str:
    """transformers' name of one layer's projection weight or bias."""
    block = "self_attn" if projection in ATTENTION_PROJECTIONS else "mlp"
    return f"model.layers.{layer}.{block}.{projection}.{kind}"


def read_hf_config(directory: str | os.PathLike) -> dict[str, Any]:
    """`config.json` of a checkpoint directory; ModelLoadError if absent, corrupt or unsupported."""
    path = pathlib.Path(directory) / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"no config.json in {directory}")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ModelLoadError(f"corrupt config.json in {directory}: {error}") from error
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelLoadError(
            f"unsupported architecture {model_type!r} in {path}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return config


def safetensors_files(directory: str | os.PathLike) -> list[pathlib.Path]:
    """The weight files of a directory: the shards of the index, or every `*.safetensors`."""
    directory = pathlib.Path(directory)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as error:
            raise ModelLoadError(f"corrupt safetensors index {index}: {error}") from error
        files = [directory / name for name in dict.fromkeys(weight_map.values())]
    else:
        files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no *.safetensors weights in {directory}")
    for file in files:
        if not file.is_file():
            raise ModelLoadError(f"missing weight shard {file}")
    return files


SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                      "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


class TensorSource:
    """Lazy name -> NumPy array access over one or more safetensors files.

    Each tensor is read from its file into a fresh array (a seek and a read: the format is an 8-byte
    header length, a JSON header of each tensor's dtype, shape and byte range, then the data), not
    through a memory map: the map's pages would stay resident as the load walks the file, 2.5 GB for
    Qwen2.5-Coder-0.5B's float32 file on top of the weights (docs/performance.md, "Where a
    DataSciCoding run's memory goes")."""

    def __init__(self, files: list[pathlib.Path]):
        self._where: dict[str, tuple[pathlib.Path, int, dict[str, Any]]] = {}
        for file in files:
            length, entries = _safetensors_header(file)
            for name, entry in entries.items():
                self._where[name] = (file, 8 + length, entry)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> np.ndarray:
        if name not in self._where:
            raise ModelLoadError(f"checkpoint lacks tensor {name}")
        file, data_start, entry = self._where[name]
        begin, end = entry["data_offsets"]
        dtype = np.dtype(SAFETENSORS_DTYPES[entry["dtype"]]) if entry["dtype"] != "BF16" else _bfloat16()
        count = (end - begin) // dtype.itemsize
        with open(file, "rb") as handle:
            handle.seek(data_start + begin)
            values = np.fromfile(handle, dtype=dtype, count=count)
        if values.size != count or count != int(np.prod(entry["shape"], dtype=np.int64)):
            raise ModelLoadError(f"corrupt tensor {name}: {values.size} of {count} values read for shape "
                                 f"{tuple(entry['shape'])}")
        return values.reshape(entry["shape"])


def _safetensors_header(file: pathlib.Path) -> tuple[int, dict[str, dict[str, Any]]]:
    """(header length, {tensor: {dtype, shape, data_offsets}}) of a safetensors file; ModelLoadError if malformed."""
    with open(file, "rb") as handle:
        prefix = handle.read(8)
        length = int.from_bytes(prefix, "little")
        try:
            header = json.loads(handle.read(length)) if len(prefix) == 8 else None
            entries = {name: entry for name, entry in header.items() if name != "__metadata__"}
            if any(entry["dtype"] not in SAFETENSORS_DTYPES or len(entry["data_offsets"]) != 2
                   or not isinstance(entry["shape"], list) for entry in entries.values()):
                raise ValueError("an entry without a known dtype, a shape and two offsets")
        except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError) as error:
            raise ModelLoadError(f"corrupt safetensors file {file}: {error}") from None
    return length, entries


def _bfloat16() -> np.dtype:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def _as_param(values: np.ndarray, shape: tuple[int, ...], dtype, name: str) -> jax.Array:
    if tuple(values.shape) != tuple(shape):
        raise ModelLoadError(f"tensor {name} has shape {values.shape}, the config implies {shape}")
    return jnp.asarray(values, dtype=dtype)


def model_from_tensors(
    config: LlamaConfig,
    get_tensor: Callable[[str], np.ndarray],
    has_tensor: Callable[[str], bool],
    *,
    lora: LoraConfig | None = LoraConfig(),
    dtype=jnp.float32,
    matmul_dtype=None,
    remat: str = "full",
    seed: int = 0,
) -> Llama:
    """A `Llama` whose base weights come from HF-named tensors (LoRA freshly initialised).

    The model is first built abstractly (`nnx.eval_shape`, no random base
    weights materialised), then each parameter is filled from the tensors,
    one stacked parameter at a time to bound peak memory.  LoRA A/B come from
    the model's own initialiser under `jax.jit` (XLA drops the unused base
    initialisation).  Parameters and computation use `dtype`; with
    `matmul_dtype` the base weight matrices are stored in it (see `Llama`).
    """

    def build():
        return Llama(
            config,
            lora=lora,
            dtype=dtype,
            param_dtype=dtype,
            matmul_dtype=matmul_dtype,
            remat=remat,
            rngs=nnx.Rngs(seed),
        )

    model = nnx.eval_shape(build)
    n_layers = config.num_hidden_layers

    def stacked(hf_kind: Callable[[int], str], transpose: bool) -> np.ndarray:
        """The layers' tensors `[L, ...]`, filled one layer at a time (no list of them beside the stack)."""
        out = None
        for i in range(n_layers):
            layer = get_tensor(hf_kind(i))
            layer = layer.T if transpose else layer
            if out is None:
                out = np.empty((n_layers, *layer.shape), layer.dtype)
            out[i] = layer
        return out

    def fill(variable: nnx.Variable, values: np.ndarray, name: str):
        abstract = variable.get_value()
        variable.set_value(_as_param(values, abstract.shape, abstract.dtype, name))

    fill(model.embed, get_tensor("model.embed_tokens.weight"), "model.embed_tokens.weight")
    fill(model.final_norm, get_tensor("model.norm.weight"), "model.norm.weight")
    if model.lm_head is not None:
        if not has_tensor("lm_head.weight"):
            raise ModelLoadError("the config says untied embeddings but the checkpoint has no lm_head.weight")
        fill(model.lm_head, get_tensor("lm_head.weight").T, "lm_head.weight")
    layers = model.layers
    fill(layers.input_norm, stacked(lambda i: f"model.layers.{i}.input_layernorm.weight", False), "input_layernorm")
    fill(
        layers.post_attention_norm,
        stacked(lambda i: f"model.layers.{i}.post_attention_layernorm.weight", False),
        "post_attention_layernorm",
    )
    for name in ATTENTION_PROJECTIONS + MLP_PROJECTIONS:
        fill(layers.weights[name], stacked(lambda i: hf_weight_name(i, name), True), name)
    for name in list(layers.biases.keys()):
        fill(layers.biases[name], stacked(lambda i: hf_weight_name(i, name, "bias"), False), f"{name} bias")
    if lora is not None:
        lora_state = jax.jit(lambda: nnx.state(build(), nnx.LoRAParam))()
        nnx.update(model, lora_state)
    return model


def load_hf_model(
    directory: str | os.PathLike,
    *,
    lora: LoraConfig | None = LoraConfig(),
    dtype=jnp.float32,
    matmul_dtype=None,
    remat: str = "full",
    seed: int = 0,
) -> Llama:
    """The `Llama` of a Hugging Face checkpoint directory (config.json + safetensors)."""
    config = LlamaConfig.from_hf(read_hf_config(directory))
    source = TensorSource(safetensors_files(directory))
    return model_from_tensors(
        config, source.get, source.__contains__, lora=lora, dtype=dtype, matmul_dtype=matmul_dtype, remat=remat, seed=seed
    )


def hf_tensors_of_model(model: Llama, dtype=np.float32) -> dict[str, np.ndarray]:
    """The model's base weights as HF-named NumPy tensors (`[out, in]`), LoRA not merged."""
    out: dict[str, np.ndarray] = {}

    def host(x):
        return np.asarray(jax.device_get(x), dtype=dtype)

    out["model.embed_tokens.weight"] = host(model.embed[...])
    out["model.norm.weight"] = host(model.final_norm[...])
    if model.lm_head is not None:
        out["lm_head.weight"] = np.ascontiguousarray(host(model.lm_head[...]).T)
    layers = model.layers
    input_norm, post_norm = host(layers.input_norm[...]), host(layers.post_attention_norm[...])
    weights = {name: host(w[...]) for name, w in layers.weights.items()}
    biases = {name: host(b[...]) for name, b in layers.biases.items()}
    for i in range(model.config.num_hidden_layers):
        out[f"model.layers.{i}.input_layernorm.weight"] = input_norm[i]
        out[f"model.layers.{i}.post_attention_layernorm.weight"] = post_norm[i]
        for name, w in weights.items():
            out[hf_weight_name(i, name)] = np.ascontiguousarray(w[i].T)
        for name, b in biases.items():
            out[hf_weight_name(i, name, "bias")] = b[i]
    return out


def write_hf_checkpoint(
    directory: str | os.PathLike, hf_config: dict[str, Any], tensors: dict[str, np.ndarray], dtype=np.float32
) -> None:
    """Writes `config.json` and one `model.safetensors` (tensors cast to `dtype`) into `directory`."""
    from safetensors.numpy import save_file

    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(hf_config, indent=2))
    cast = {name: np.ascontiguousarray(values, dtype=dtype) for name, values in tensors.items()}
    save_file(cast, str(directory / "model.safetensors"), metadata={"format": "pt"})


def save_hf_model(directory: str | os.PathLike, model: Llama, tokenizer=None, dtype=np.float32) -> None:
    """Exports `model` (base weights; merge LoRA first to include it) and `tokenizer` as an HF directory."""
    write_hf_checkpoint(directory, model.config.to_hf(), hf_tensors_of_model(model, dtype), dtype)
    if tokenizer is not None:
        tokenizer.save(directory)
