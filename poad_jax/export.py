"""`python -m poad_jax.export --workdir W --format peft --out DIR`

Writes the trained actor's LoRA adapter in PEFT format:
`adapter_model.safetensors` (keys
`base_model.model.model.layers.{i}.self_attn.{q,k,v,o}_proj.lora_{A,B}.weight`,
`...mlp.{gate,up,down}_proj...`; A `[r, in]`, B `[out, r]`) and
`adapter_config.json` (r, lora_alpha, target_modules, base model).  Our A is
stored `[L, in, r]` and B `[L, r, out]`; PEFT wants each layer's transpose.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import numpy as np

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
    """(config, model with the trained actor LoRA, tokenizer, train state) of a run directory."""
    import ml_collections
    from flax import nnx

    from poad_jax import checkpoint as checkpoint_lib
    from poad_jax import train
    from poad_jax.learner import init_train_state
    from poad_jax.methods import make_method
    from poad_jax.policy import ValueHead, merge_model, split_policy

    config_path = workdir / "config.json"
    if not config_path.exists():
        raise ExportError(f"{workdir} is not a run directory (no config.json)")
    config = ml_collections.ConfigDict(json.loads(config_path.read_text()))
    checkpointer = checkpoint_lib.RunCheckpointer(workdir)
    if checkpointer.latest_step() is None:
        raise ExportError(f"{workdir} has no checkpoint yet")
    model, tokenizer = train.load_model(config)
    head = ValueHead(model.config.hidden_size, tuple(config.critic.hidden_sizes), rngs=nnx.Rngs(0))
    graph, frozen, params = split_policy(model, head)
    if config.critic.kind == "lora":
        params["critic_lora"] = train._fresh_critic_lora(model, int(config.seed))
    make_method(config.method, float(config.ppo.gamma))
    state = init_train_state(params, train.learner_config(config), __import__("jax").random.key(0))
    state, _ = checkpointer.restore(state)
    checkpointer.close()
    return config, merge_model(graph, frozen, state.params["actor"]), tokenizer, state


def export_peft(workdir: str | pathlib.Path, out: str | pathlib.Path) -> pathlib.Path:
    from safetensors.numpy import save_file

    workdir, out = pathlib.Path(workdir), pathlib.Path(out)
    config, model, _, _ = load_trained_actor(workdir)
    layers = model.layers
    lora_a = {name: np.asarray(value[...]) for name, value in layers.lora_a.items()}
    lora_b = {name: np.asarray(value[...]) for name, value in layers.lora_b.items()}
    if not lora_a:
        raise ExportError("the run's model has no LoRA adapters")
    out.mkdir(parents=True, exist_ok=True)
    save_file(peft_tensors(lora_a, lora_b), str(out / "adapter_model.safetensors"))
    lora = model.lora_config
    (out / "adapter_config.json").write_text(
        json.dumps(adapter_config(lora.rank, lora.alpha, list(lora.targets), str(config.model)), indent=2)
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m poad_jax.export", description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", required=True, help="run directory written by poad_jax.train")
    parser.add_argument("--format", default="peft", choices=["peft"], help="adapter format")
    parser.add_argument("--out", required=True, help="output directory")
    args = parser.parse_args(argv)
    try:
        out = export_peft(args.workdir, args.out)
    except ExportError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote PEFT adapter to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
