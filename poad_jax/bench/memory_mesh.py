"""`python -m poad_jax.bench memory_mesh`: per-device memory of the compiled
PPO update on device meshes, for LLaMA-7B and a 34B shape, from shapes alone.

No weights are made: the model, train state and TokenBatch are
ShapeDtypeStructs carrying their shardings (`poad_jax.bench._update_memory`);
the sharded update is lowered and compiled for each mesh and XLA's
`memory_analysis()` gives one device's bytes.  On CPU the meshes are made of
host devices (`--cpu-devices`, default 8); on a GPU node, of its GPUs.

Columns (GiB per device):
  base     the frozen base's shard (exact: shard shapes)
  state    LoRA, value head, Adam states, RNG (exact)
  batch    the TokenBatch's rows (exact)
  args     XLA's argument bytes (= base + state + batch)
  temp     XLA's temporaries: activations, gradients, gathered weights
           (XLA:CPU's buffer assignment, an estimate of a GPU's)
  peak     args + temp + outputs - aliased (the donated state)

`--no-activation-hook` compiles the update as before FSDP became ZeRO-3
(activations left to the partitioner, which then moves rows to the weight
shards instead of gathering weights), for comparison.

The last line is `{"bench": "memory_mesh", "rows": [...]}`.
"""

from __future__ import annotations

import json
import sys

from poad_jax.run.config.errors import ArgumentParser

GIB = 1024 ** 3

MODELS = {
    "llama-7b": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_layers=32, num_heads=32,
                     num_kv_heads=32),
    "codellama-34b": dict(vocab_size=32000, hidden_size=8192, intermediate_size=22016, num_layers=48,
                          num_heads=64, num_kv_heads=8),
}
MESHES = {"llama-7b": "1x1x1,8x1x1,1x8x1,2x4x1,1x4x2", "codellama-34b": "1x1x1,1x8x1,2x4x1,1x4x2"}


def parse_meshes(text: str) -> list[tuple[int, int, int]]:
    meshes = []
    for item in text.split(","):
        parts = item.lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"a mesh is DATAxFSDPxTENSOR, e.g. 1x8x1; got {item!r}")
        meshes.append(tuple(int(p) for p in parts))
    return meshes


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="python -m poad_jax.bench memory_mesh", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama-7b,codellama-34b", help=f"of {sorted(MODELS)}")
    parser.add_argument("--meshes", default=None, help="DATAxFSDPxTENSOR,... (default: per model)")
    parser.add_argument("--rows", type=int, default=64, help="rows per update (threads x steps)")
    parser.add_argument("--prompt-tokens", type=int, default=192)
    parser.add_argument("--action-tokens", type=int, default=64)
    parser.add_argument("--accumulation-steps", type=int, default=4)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--lora-sharding", default="replicated", choices=("replicated", "follow_base"))
    parser.add_argument("--cpu-devices", type=int, default=8, help="host devices when running on CPU")
    parser.add_argument("--no-activation-hook", action="store_true",
                        help="compile without the per-layer activation constraint (before ZeRO-3)")
    args = parser.parse_args(argv)
    unknown = [m for m in args.models.split(",") if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {sorted(MODELS)}")
    try:
        meshes = {m: parse_meshes(args.meshes or MESHES[m]) for m in args.models.split(",")}
    except ValueError as error:
        parser.error(str(error))

    import jax

    try:  # before the backend starts; ignored by GPU and TPU backends
        jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    except RuntimeError:
        pass
    from poad_jax import parallel as dist
    from poad_jax.bench._update_memory import update_memory

    devices = jax.devices()
    print(f"compiled PPO update per device on {devices[0].platform} ({len(devices)} devices), {args.dtype} base, "
          f"LoRA r={args.lora_rank} on q,v ({args.lora_sharding}), {args.rows} rows x "
          f"{args.prompt_tokens}+{args.action_tokens} tokens, {args.accumulation_steps} micro-batches"
          + (", no activation hook" if args.no_activation_hook else ""))
    print(f"{'model':<14} {'mesh':>7} {'base':>7} {'state':>7} {'batch':>7} {'args':>7} {'temp':>7} {'peak':>7}  (GiB)")
    rows = []
    for model, model_meshes in meshes.items():
        for shape in model_meshes:
            if shape[0] * shape[1] * shape[2] > len(devices):
                print(f"{model:<14} {'x'.join(map(str, shape)):>7}  skipped: needs more devices", file=sys.stderr)
                continue
            result = update_memory(
                dist.make_mesh(*shape), **MODELS[model], rows=args.rows, prompt_len=args.prompt_tokens,
                action_len=args.action_tokens, dtype=args.dtype, lora_rank=args.lora_rank,
                lora_sharding=args.lora_sharding, accumulation_steps=args.accumulation_steps,
                constrain_activations=not args.no_activation_hook)
            peak = result["argument_bytes"] + result["temp_bytes"] + result["output_bytes"] - result["alias_bytes"]
            result.update(model=model, peak_bytes=peak)
            rows.append(result)
            cells = [result[k] / GIB for k in ("base_bytes", "state_bytes", "batch_bytes", "argument_bytes",
                                               "temp_bytes", "peak_bytes")]
            print(f"{model:<14} {'x'.join(map(str, shape)):>7} " + " ".join(f"{c:>7.2f}" for c in cells), flush=True)
    print(json.dumps({"bench": "memory_mesh", "platform": devices[0].platform, "rows": rows}))
    return 0
