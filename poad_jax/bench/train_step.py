"""`python -m poad_jax.bench train_step`: our jit PPO update vs PyTorch + PEFT.

SmolLM2-135M-Instruct shapes, CPU, 8 sequences x 256 tokens (prompt
128 + action 128, every action token valid), LoRA r=8 alpha 16 on q_proj and
v_proj, critic = MLP head (576 -> 1024 -> 512 -> 1) on precomputed frozen-base
features.  One POAD update with one epoch and one minibatch on both sides:
GAE, forward through the LoRA actor (logits at the action columns only),
clipped policy loss + clipped value loss + entropy bonus, backward, global
norm clipping at 0.5, one Adam step per optimiser (`_torch_reference.py`
states the PyTorch step; ours is `poad_jax.agent.learner.jit_update`).

Both sides load the same Hugging Face directory (the embedded model's
conversion, or with `--random-weights` a random model of the same shapes)
and see the same token ids, rewards, values and features.  Each side runs
in its own subprocess (its own peak RSS); the parent alternates the sides
for `--rounds` rounds of `--steps` timed steps after one warm-up step
(compilation for us), and compares medians, so a noisy shared machine hits
both sides alike.

  tokens/s = rows x (prompt + action tokens) / wall time of one update

GPU scale: `--shape=llama-7b --sides=jax --dtype=bfloat16 --peak-tflops=989
--rows=N` builds a random-weight LLaMA-7B-shaped model in memory and reports
MFU two ways (see `step_flops`).

Precision and memory options (ours: the library's model options; see
`poad_jax.models.llama.Llama`):
  --matmul-dtype  bfloat16 (default): bfloat16 operands, float32
                  accumulation, forward and backward; float32: all float32
  --remat         full (default) | dots | none: what the layer scan saves
  --torch-dtype   float32 (default, the issue's baseline) | bfloat16: the
                  PyTorch forward under torch.autocast("cpu", bfloat16)
`--profile` times, for our side, the forward (loss only), forward + backward
(value_and_grad) and the whole update as separate jit functions.
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
from poad_jax.core import flops
from poad_jax.bench import _sides
from poad_jax.bench._shapes import SHAPES, build_random_model
from poad_jax.models.llama import REMAT_POLICIES

ROWS = 8
PROMPT = 128
ACTION = 128
THREADS = 4  # rows = threads x steps per thread


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def synthetic_arrays(args, vocab_size: int, hidden_size: int) -> dict:
    """The shared NumPy inputs: token ids, rewards, dones, old values, features, bootstrap values."""
    import numpy as np

    rng = np.random.default_rng(1234)
    rows, length = args.rows, args.prompt + args.action
    return {
        "tokens": rng.integers(3, vocab_size, (rows, length)).astype(np.int32),
        "positions": np.broadcast_to(np.arange(length, dtype=np.int32), (rows, length)).copy(),
        "rewards": rng.normal(size=rows).astype(np.float32),
        "dones": (rng.random(rows) < 0.25),
        "old_values": (0.1 * rng.normal(size=(rows, args.action))).astype(np.float32),
        "features": rng.normal(size=(rows, args.action, hidden_size)).astype(np.float32),
        "bootstrap_value": (0.1 * rng.normal(size=args.threads)).astype(np.float32),
    }


def run_jax(directory: str, args) -> dict:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from poad_jax.agent import learner as learner_lib
    from poad_jax.run.config import learner_config
    from poad_jax.agent.methods import make_method
    from poad_jax.models import hf_io
    from poad_jax.models.llama import LoraConfig
    from poad_jax.core.critic_config import CriticConfig
    from poad_jax.core.policy import PackedRows, ValueHead, action_logprobs, split_policy
    from poad_jax.core.token_batch import TokenLevelBatch

    lora = LoraConfig(rank=8, alpha=16.0, targets=("q_proj", "v_proj"))
    matmul_dtype = None if args.matmul_dtype == "float32" else jnp.dtype(args.matmul_dtype)
    dtype = jnp.dtype(args.dtype)
    if args.shape:
        model = build_random_model(args.shape, lora=lora, dtype=dtype, matmul_dtype=matmul_dtype, remat=args.remat)
    else:
        model = hf_io.load_hf_model(directory, lora=lora, dtype=dtype, matmul_dtype=matmul_dtype, remat=args.remat)
    config = model.config
    head = ValueHead(config.hidden_size, CriticConfig(), rngs=nnx.Rngs(1))
    graph, frozen, params = split_policy(model, head)
    del model, head
    method = make_method("poad", 0.95)
    lconfig = learner_config(gamma=0.95, epochs=1, num_minibatches=1, accumulation_steps=1)
    arrays = synthetic_arrays(args, config.vocab_size, config.hidden_size)
    rows, action = args.rows, args.action
    tokens = jnp.asarray(arrays["tokens"])
    positions = jnp.asarray(arrays["positions"])
    key_mask = jnp.ones(tokens.shape, bool)
    old_logprobs, _ = jax.jit(lambda frozen, actor, *arrays: action_logprobs(
        graph, frozen, actor, PackedRows(*arrays, args.prompt), 1.0))(
            frozen, params["actor"], tokens, positions, key_mask)
    batch = TokenLevelBatch(
        tokens=tokens,
        positions=positions,
        key_mask=key_mask,
        action_mask=jnp.ones((rows, action), bool),
        rewards=jnp.asarray(arrays["rewards"]),
        dones=jnp.asarray(arrays["dones"]),
        old_logprobs=old_logprobs,
        old_values=jnp.asarray(arrays["old_values"]),
        features=jnp.asarray(arrays["features"]),
        bootstrap_value=jnp.asarray(arrays["bootstrap_value"]),
        allowed_tokens=jnp.zeros((rows, action, 1), jnp.int32),
        allowed_mask=jnp.zeros((rows, action, 1), bool),
    )
    update, compiles = learner_lib.jit_update(graph, method, lconfig)
    state = learner_lib.init_train_state(params, lconfig, jax.random.key(0))

    start = time.perf_counter()
    state, metrics = update(state, frozen, batch)
    jax.block_until_ready(metrics)
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        state, metrics = update(state, frozen, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    result = {
        "times": times,
        "flops": step_flops(config, args.rows, args.prompt + args.action, args.action),
        "device": str(jax.devices()[0].device_kind),
        "first_call_s": compile_s,
        "compiles": compiles(),
        "skipped": float(metrics["skipped_minibatches"]),
        "loss": float(metrics["loss"]),
    }
    if args.profile:
        result["phases"] = jax_phases(graph, frozen, state, batch, method, lconfig, args.steps)
    result["peak_rss_mib"] = peak_rss_mib()
    return result


def step_flops(config, rows: int, length: int, logit_columns: int) -> dict:
    """Matmul FLOPs of one update, counted two ways (multiply-add = 2 FLOPs).

    forward F = `flops.pass_flops` of the rows (the output layer at the action
    columns only; attention's full square, the causal mask not discounted).
    The frozen base needs no weight gradients, so the useful work of an
    update is forward + backward through the activations = 2F ("useful");
    the conventional 6 x params x tokens corresponds to 3F and overstates a
    frozen-base LoRA step ("6N"); with remat="full" the hardware also
    recomputes most of the forward once more (`flops.training_flops` counts
    that), which neither figure counts.
    """
    forward = flops.pass_flops(config, flops.Pass(rows, length, logit_columns)).total
    base = flops.decoder_weights(config) + config.hidden_size * config.vocab_size
    return {"forward": forward, "useful": 2 * forward, "6N": 6 * base * rows * length, "base_params": base}


def jax_phases(graph, frozen, state, batch, method, lconfig, repeats: int) -> dict:
    """Median seconds of forward (loss), forward + backward, and the gap to the whole update."""
    import jax

    from poad_jax.agent import learner as learner_lib
    from poad_jax.core import losses

    advantages, returns = learner_lib.compute_advantages(batch, method, lconfig)

    def loss_fn(params):
        logprobs, entropy, values, mask = learner_lib.policy_outputs(graph, frozen, params, batch, method, lconfig)
        surrogate = losses.clipped_surrogate(logprobs, batch.old_logprobs, advantages, lconfig.clip_eps)
        policy_loss = losses.masked_mean(surrogate, mask)
        value_error = losses.clipped_value_error(values, batch.old_values, returns, lconfig.value_clip_eps)
        value_loss = losses.masked_mean(value_error, mask)
        return policy_loss + lconfig.vf_coef * value_loss - lconfig.ent_coef * losses.masked_mean(entropy, mask)

    forward = jax.jit(loss_fn)
    forward_backward = jax.jit(jax.value_and_grad(loss_fn))
    out = {}
    for name, fn in (("forward", forward), ("forward_backward", forward_backward)):
        jax.block_until_ready(fn(state.params))
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(fn(state.params))
            times.append(time.perf_counter() - start)
        out[name] = statistics.median(times)
    return out


def run_torch(directory: str, args) -> dict:
    try:
        import torch

        from poad_jax.bench._torch_reference import TorchPPOStep
    except ImportError as error:
        raise SystemExit(f"error: {error}; the baseline needs the bench extra: pip install torch==2.13.0 peft")

    autocast = None if args.torch_dtype == "float32" else getattr(torch, args.torch_dtype)
    reference = TorchPPOStep(directory, autocast_dtype=autocast)
    config = reference.model.config
    arrays = synthetic_arrays(args, config.vocab_size, config.hidden_size)
    batch = {name: torch.from_numpy(value) for name, value in arrays.items()}
    batch["tokens"] = batch["tokens"].long()
    batch["positions"] = batch["positions"].long()
    batch["prompt_len"] = args.prompt
    batch["action_mask"] = torch.ones((args.rows, args.action), dtype=torch.bool)
    with torch.no_grad():
        batch["old_logprobs"] = reference.action_logprobs(batch["tokens"], batch["positions"], args.prompt)[0]

    start = time.perf_counter()
    reference.step(batch, args.threads)
    first_s = time.perf_counter() - start
    times, phases = [], []
    for _ in range(args.steps):
        start = time.perf_counter()
        info = reference.step(batch, args.threads)
        times.append(time.perf_counter() - start)
        phases.append(info)
    return {
        "times": times,
        "first_call_s": first_s,
        "threads": torch.get_num_threads(),
        "skipped": float(phases[-1]["skipped"]),
        "loss": phases[-1]["loss"],
        "phases": {k: statistics.median(p[k] for p in phases) for k in ("forward_s", "backward_s", "optimizer_s")},
        "peak_rss_mib": peak_rss_mib(),
    }


def model_directory(random_weights: bool, scratch: str) -> tuple[str, str]:
    """(HF directory both sides load, description)."""
    from poad_jax.bench.generate import model_directory as shared_directory

    return shared_directory(random_weights, scratch)


def run_side(side: str, directory: str, args) -> dict:
    """Runs one side in a fresh subprocess; returns its JSON line."""
    arguments = [
        f"--directory={directory}", f"--rows={args.rows}", f"--prompt={args.prompt}", f"--action={args.action}",
        f"--threads={args.threads}", f"--steps={args.steps}", f"--remat={args.remat}",
        f"--matmul-dtype={args.matmul_dtype}", f"--torch-dtype={args.torch_dtype}",
    ] + (["--profile"] if args.profile else [])
    if args.shape:
        arguments.append(f"--shape={args.shape}")
    arguments.append(f"--dtype={args.dtype}")
    return _sides.run_side("train_step", side, arguments, args.xla_flags)


def build_parser() -> ArgumentParser:
    """The command line: sizes, precision and memory options, sides, and the child's hidden flags."""
    parser = ArgumentParser(prog="python -m poad_jax.bench train_step", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=ROWS, help="sequences per update")
    parser.add_argument("--prompt", type=int, default=PROMPT, help="prompt tokens per sequence")
    parser.add_argument("--action", type=int, default=ACTION, help="action tokens per sequence")
    parser.add_argument("--threads", type=int, default=THREADS, help="rollout threads (rows = threads x steps)")
    parser.add_argument("--steps", type=int, default=3, help="timed updates per round and side")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (one subprocess per side each)")
    parser.add_argument("--remat", choices=REMAT_POLICIES, default="full",
                        help="what our layer scan saves for the backward pass (see poad_jax.models.llama)")
    parser.add_argument("--matmul-dtype", choices=("float32", "bfloat16"), default="bfloat16",
                        help="our matmul operands (float32 accumulation either way; see poad_jax.models.llama.Llama)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="",
                        help="random weights of these shapes, built in memory (ours only: needs --sides=jax)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="our activations and parameters (bfloat16 on a GPU)")
    parser.add_argument("--peak-tflops", type=float, default=0.0,
                        help="the device's peak TFLOP/s for MFU, e.g. 989 for an H100's dense bfloat16")
    parser.add_argument("--torch-dtype", choices=("float32", "bfloat16"), default="float32",
                        help="PyTorch side: float32, or its forward under torch.autocast('cpu', bfloat16)")
    parser.add_argument("--profile", action="store_true", help="also time forward / forward+backward phases")
    parser.add_argument("--xla-flags", default="", help="extra XLA_FLAGS for our side, e.g. --xla_cpu_use_onednn=true")
    parser.add_argument("--random-weights", action="store_true", help="random model of SmolLM2 shapes")
    parser.add_argument("--sides", choices=("both", "jax", "torch"), default="both")
    parser.add_argument("--side", choices=("jax", "torch"), help=argparse.SUPPRESS)
    parser.add_argument("--directory", help=argparse.SUPPRESS)
    return parser


def parse_arguments(argv: list[str]) -> argparse.Namespace | None:
    """The parsed and checked arguments, or None after printing the error (exit status 2)."""
    args = build_parser().parse_args(argv)
    if min(args.rows, args.prompt, args.action, args.threads, args.steps, args.rounds) < 1 or args.rows % args.threads:
        print("error: sizes must be >= 1 and --rows divisible by --threads", file=sys.stderr)
        return None
    if args.shape and args.sides != "jax" and not args.side:
        print("error: --shape builds our model only; add --sides=jax", file=sys.stderr)
        return None
    return args


def run_rounds(args, sides: tuple[str, ...]) -> tuple[dict[str, list[dict]], str]:
    """Runs the sides alternately for `args.rounds` rounds; returns (each side's runs, model description)."""
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as scratch:
        if args.shape:
            directory, source = "", f"random weights, {args.shape} shapes"
        else:
            directory, source = model_directory(args.random_weights, scratch)
        for round_index in range(args.rounds):
            order = sides if round_index % 2 == 0 else tuple(reversed(sides))
            for side in order:
                runs[side].append(run_side(side, directory, args))
    return runs, source


def side_figures(side_runs: list[dict], tokens: int) -> dict:
    """One side's tokens/s, median step, peak RSS, step times, first call and (if profiled) phases."""
    times = [t for r in side_runs for t in r["times"]]
    median = statistics.median(times)
    figures = {"tok_s": tokens / median, "median_s": median, "peak_rss_mib": max(r["peak_rss_mib"] for r in side_runs),
               "times": times, "first_call_s": statistics.median(r["first_call_s"] for r in side_runs)}
    if "phases" in side_runs[0]:
        figures["phases"] = {k: statistics.median(r["phases"][k] for r in side_runs) for k in side_runs[0]["phases"]}
    return figures


def print_table(args, sides: tuple[str, ...], runs: dict[str, list[dict]], source: str, device: str) -> dict:
    """Prints the setting and one row per side (and its phases); returns each side's `side_figures`."""
    tokens = args.rows * (args.prompt + args.action)
    names = {"jax": f"poad_jax (jit, {args.matmul_dtype} matmuls, remat {args.remat})",
             "torch": f"PyTorch + PEFT ({args.torch_dtype})"}
    print(f"train_step: {source}, {device}, {args.rows} x {args.prompt + args.action} tokens "
          f"(prompt {args.prompt} + action {args.action}), LoRA r=8 q,v, one PPO update (1 epoch, 1 minibatch); "
          f"median of {args.rounds} x {args.steps} steps per side")
    print(f"{'side':32s} {'tokens/s':>9s} {'median s':>9s} {'min s':>7s} {'max s':>7s} {'first s':>8s} "
          f"{'peak RSS MiB':>13s}")
    summary_sides = {}
    for side in sides:
        s = summary_sides[side] = side_figures(runs[side], tokens)
        times = s["times"]
        print(f"{names[side]:32s} {s['tok_s']:9.1f} {s['median_s']:9.2f} {min(times):7.2f} {max(times):7.2f} "
              f"{s['first_call_s']:8.1f} {s['peak_rss_mib']:13.0f}")
        if "phases" in s:
            print("  phases (median s): " + ", ".join(f"{k} {v:.2f}" for k, v in s["phases"].items()))
    return summary_sides


def mfu_figures(args, jax_run: dict, seconds: float) -> dict:
    """Our FLOPs per step and device kind, and with `--peak-tflops` the MFU both ways (printed too)."""
    counted = jax_run["flops"]
    figures = {"flops_per_step": counted, "device_kind": jax_run["device"]}
    if args.peak_tflops > 0:
        for key in ("useful", "6N"):
            figures[f"mfu_{key}"] = round(counted[key] / seconds / (args.peak_tflops * 1e12), 4)
        print(f"MFU at {args.peak_tflops:g} TFLOP/s peak: {figures['mfu_useful']:.1%} counting forward + "
              f"activation backward (2F), {figures['mfu_6N']:.1%} by the 6 x params x tokens convention")
    return figures


def side_summary(summary_sides: dict) -> dict:
    """The JSON line's per-side figures: ours_* and pytorch_* (tokens/s, step seconds, peak RSS, phases)."""
    summary = {}
    for side, key in (("jax", "ours"), ("torch", "pytorch")):
        if side in summary_sides:
            s = summary_sides[side]
            summary[f"{key}_tok_s"] = round(s["tok_s"], 1)
            summary[f"{key}_step_s"] = round(s["median_s"], 3)
            summary[f"{key}_peak_rss_mib"] = round(s["peak_rss_mib"])
            if "phases" in s:
                summary[f"{key}_phases_s"] = {k: round(v, 3) for k, v in s["phases"].items()}
    return summary


def main(argv: list[str]) -> int:
    args = parse_arguments(argv)
    sides = _sides.exit_status_or_sides(args, run_jax, run_torch)
    if isinstance(sides, int):
        return sides
    runs, source = run_rounds(args, sides)
    device = runs["jax"][0]["device"] if "jax" in runs else "cpu"
    summary_sides = print_table(args, sides, runs, source, device)
    summary = {"bench": "train_step"}
    if "jax" in summary_sides:
        summary.update(mfu_figures(args, runs["jax"][0], summary_sides["jax"]["median_s"]))
    if len(sides) == 2:
        ratio = summary_sides["jax"]["tok_s"] / summary_sides["torch"]["tok_s"]
        print(f"ratio (ours / PyTorch tokens/s): {ratio:.2f}")
        summary["ratio"] = round(ratio, 3)
    summary.update(side_summary(summary_sides))
    summary.update(rows=args.rows, prompt=args.prompt, action=args.action, remat=args.remat,
                   matmul_dtype=args.matmul_dtype, torch_dtype=args.torch_dtype,
                   xla_flags=args.xla_flags, load_average=round(os.getloadavg()[0], 1), model=source,
                   device=device, rounds=args.rounds, steps=args.steps)
    print(json.dumps(summary))
    return 0
