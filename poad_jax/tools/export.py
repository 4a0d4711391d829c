"""`python -m poad_jax.export --workdir W --format peft --out DIR`

Writes the trained actor's LoRA adapter in PEFT format:
`adapter_model.safetensors` (keys
`base_model.model.model.layers.{i}.self_attn.{q,k,v,o}_proj.lora_{A,B}.weight`,
`...mlp.{gate,up,down}_proj...`; A `[r, in]`, B `[out, r]`) and
`adapter_config.json` (r, lora_alpha, target_modules, and a base model PEFT
can load: the run's Hugging Face directory, an embedded model's cached one, or
`--base-model`).  Our A is stored `[L, in, r]` and B `[L, r, out]`; PEFT wants
each layer's transpose.  Loading it (peft, torch and transformers):

    base = PeftConfig.from_pretrained(out).base_model_name_or_path
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), out)
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib
import sys

import jax
import ml_collections
import numpy as np
from safetensors.numpy import save_file

from poad_jax.run.config.errors import ArgumentParser, missing_run_directory
from poad_jax.agent.learner import init_train_state
from poad_jax.core.policy import merge_model
from poad_jax.models.loading import EMBEDDED_MODELS, embedded_model_directory
from poad_jax.run import checkpoint as checkpoint_lib
from poad_jax.run import config as config_lib
from poad_jax.run import rundir
from poad_jax.run.build import TrainError, build

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


class ExportError(Exception):
    pass


def peft_tensors(lora_a: dict[str, np.ndarray], lora_b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """PEFT state dict from stacked adapters {target: A [L, in, r]}, {target: B [L, r, out]}."""
    tensors = {}
    for target, a in lora_a.items():
        b = lora_b[target]
        block = "self_attn" if target in ATTENTION else "mlp"
        for layer in range(a.shape[0]):
            prefix = f"base_model.model.model.layers.{layer}.{block}.{target}"
            tensors[f"{prefix}.lora_A.weight"] = np.ascontiguousarray(a[layer].T.astype(np.float32))
            tensors[f"{prefix}.lora_B.weight"] = np.ascontiguousarray(b[layer].T.astype(np.float32))
    return tensors


def adapter_config(rank: int, alpha: float, targets: list[str], base_model: str) -> dict:
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "target_modules": list(targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
    }


def load_trained_actor(workdir: pathlib.Path):
    """(settings, model with the trained actor LoRA, tokenizer, train state) of a run directory,
    built from its `config.json` as the trainer builds it (`poad_jax.run.build`).  The settings are
    the stored config typed once (`run.config.typed`), here for both `export` and `evaluate`."""
    if (missing := missing_run_directory(workdir)) is not None:
        raise ExportError(missing)
    config_path = workdir / "config.json"
    if not config_path.exists():
        raise ExportError(f"{workdir} is not a run directory (no config.json)")
    try:
        config = config_lib.completed(ml_collections.ConfigDict(json.loads(config_path.read_text())))
    except json.JSONDecodeError as error:
        raise ExportError(f"{config_path} is unreadable: {error}") from None
    if not checkpoint_lib.checkpoint_steps(workdir):
        raise ExportError(f"{workdir} has no checkpoint yet")
    try:
        run = config_lib.typed(config)
        rundir.register_recorded_environment(workdir, run.env.name)  # a user's own environment
        built = build(run)
    except TrainError as error:
        raise ExportError(str(error)) from None
    state = init_train_state(built.params, built.learner, jax.random.key(0))  # a template: restored below
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)  # Orbax warns that a read-only manager is read only: it is meant to be
    try:
        checkpointer = checkpoint_lib.RunCheckpointer(workdir, create=False)  # reads only: writes nothing
    finally:
        absl_logger.setLevel(level)
    try:
        state, _, _ = checkpointer.restore_newest_intact(state, warn=lambda line: print(line, file=sys.stderr))
    except checkpoint_lib.NoIntactCheckpointError as error:
        raise ExportError(str(error)) from None
    finally:
        checkpointer.close()
    return run, merge_model(built.graph, built.frozen, state.params["actor"]), built.tokenizer, state


def check_out_dir(out: pathlib.Path) -> None:
    """Raises ExportError unless `out` is a directory or can become one (checked before the slow load)."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file; give a directory for the adapter files")
    existing = out
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ExportError(f"cannot create --out {out}: {existing} is a file")


def peft_base_model(model: str, workdir: pathlib.Path) -> tuple[str, str | None]:
    """(what `adapter_config.json` names as the base model, a note when PEFT cannot load that name).

    An embedded model: its converted Hugging Face directory in the cache; a Hugging Face directory:
    its absolute path (a run's config may hold it relative to where the run started, the run
    directory's parent or the working directory); a `.gguf` file or `tiny-random` have no directory
    transformers loads as is: their name, with a note."""
    if model in EMBEDDED_MODELS:
        return str(embedded_model_directory(model)), None  # converted when the run was built: no work here
    if model == "tiny-random":
        return model, ("tiny-random is a test model with no Hugging Face form: PEFT cannot load its base "
                       "(give --base-model for another)")
    path = pathlib.Path(model).expanduser()
    candidates = [path] if path.is_absolute() else [pathlib.Path.cwd() / path, workdir.absolute().parent / path]
    found = next((c for c in candidates if c.exists()), candidates[0]).resolve()
    if found.is_file():
        return str(found), (f"{found.name} is a GGUF file: transformers loads it with "
                            f"from_pretrained(<its directory>, gguf_file=...), not by this name")
    return str(found), None


def export_peft(workdir: str | pathlib.Path, out: str | pathlib.Path, base_model: str | None = None,
                say=print) -> pathlib.Path:
    """Writes the adapter of run `workdir` to `out`; `base_model` (e.g. the hub id the model came
    from) replaces the base model it names (`peft_base_model`)."""
    workdir, out = pathlib.Path(workdir), pathlib.Path(out)
    check_out_dir(out)
    run, model, _, _ = load_trained_actor(workdir)
    layers = model.layers
    lora_a = {name: np.asarray(value[...]) for name, value in layers.lora_a.items()}
    lora_b = {name: np.asarray(value[...]) for name, value in layers.lora_b.items()}
    if not lora_a:
        raise ExportError("the run's model has no LoRA adapters")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ExportError(f"cannot create --out {out}: {error.strerror or error}") from None
    save_file(peft_tensors(lora_a, lora_b), str(out / "adapter_model.safetensors"))
    lora = model.lora_config
    base, note = (base_model, None) if base_model else peft_base_model(run.model, workdir)
    if note:
        say(f"note: {note}")
    (out / "adapter_config.json").write_text(
        json.dumps(adapter_config(lora.rank, lora.alpha, list(lora.targets), base), indent=2)
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="python -m poad_jax.export", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Writes a run's trained LoRA adapter in PEFT format (adapter_model.safetensors,\n"
                    "adapter_config.json naming a base model PEFT can load), to use with transformers.",
        epilog="example:\n"
               "  python -m poad_jax.export --workdir=runs/ds --out=runs/ds/adapter\n"
               "then, in Python (the bench extra has peft, torch and transformers):\n"
               "  model = AutoModelForCausalLM.from_pretrained(PeftConfig.from_pretrained(out).base_model_name_or_path)\n"
               "  model = PeftModel.from_pretrained(model, out)")
    parser.add_argument("--workdir", required=True, help="run directory written by poad_jax.train")
    parser.add_argument("--format", default="peft", choices=["peft"], help="adapter format")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--base-model", default=None, metavar="NAME_OR_PATH",
                        help="the base model the adapter names, e.g. the hub id your model directory came from "
                             "(default: the run's model directory, an embedded model's cached one)")
    args = parser.parse_args(argv)
    try:
        out = export_peft(args.workdir, args.out, args.base_model)
    except ExportError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote PEFT adapter to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
