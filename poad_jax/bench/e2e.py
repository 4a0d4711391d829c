"""`python -m poad_jax.bench e2e --config=configs/datasci.py`: the whole training loop's speed.

Runs a short training (`--updates` PPO updates through `poad_jax.run.train.run`,
in a temporary workdir unless `--workdir` is given; checkpoints, TensorBoard
and plots off) and reports seconds per 1k env steps of the whole loop and
its split between sampling (the jit sampler), the environment, the behaviour
statistics (old log-probs, critic features and values), the learner update
and the rest (packing, logging, checkpoint), from the per-update records.

The first update includes the compilations of the sampler and the learner;
with two or more updates the table also gives the warm figure (updates
after the first).  Config overrides use the training CLI's syntax:
`--config.model=tiny-random --config.num_threads=2`.

Side by side: `--versus=<overrides>` runs a second configuration (the same
arguments plus the comma-separated overrides, e.g.
`--versus=config.method=twosome` or `--versus=config.share_prompt=false`),
each side in its own subprocess (`--rounds=N` alternates them N times and
takes medians), and prints the ratio of the second's seconds per 1k env
steps to the first's, and each side's compilation counts.
`--config.share_prompt=false` (or its short form `--share_prompt=false`)
gives TWOSOME's per-candidate computation (every candidate runs the whole
prompt again) instead of one prompt encoding per state.

Roofline: the records' matmul FLOPs (`flops_*`, counted by `poad_jax.core.flops`
from the model config and the padded shapes each pass ran) per env step,
against the machine's matmul throughput measured here (a `[2048, 2048] x
[2048, 2048]` matmul in the run's matmul dtype, as the model runs its
matmuls; the better of a measurement before and one after the run): the
loop's and each phase's achieved fraction of it.
"""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from poad_jax.bench._flags import parse_or_report

PHASES = ("sampling", "env", "behaviour", "learner")
FLOP_PHASES = {"sampling": "flops_sampler", "behaviour": "flops_behaviour", "learner": "flops_learner"}


def parse(argv: list[str]):
    from absl import flags
    from ml_collections import config_flags

    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", "configs/datasci.py", "Training config file.", flag_values=values)
    flags.DEFINE_integer("updates", 2, "PPO updates to run (one rollout each).", flag_values=values)
    flags.DEFINE_string("workdir", "", "Run directory (default: a temporary one, removed afterwards).",
                        flag_values=values)
    flags.DEFINE_bool("share_prompt", True, "False sets config.share_prompt=False (TWOSOME per candidate).",
                      flag_values=values)
    flags.DEFINE_string("versus", "", "Comma-separated overrides of a second side, e.g. config.method=twosome.",
                        flag_values=values)
    flags.DEFINE_integer("rounds", 1, "Side by side: times each side runs (alternating); medians are reported.",
                         flag_values=values)
    values(["e2e", *argv])
    return values


def versus_argv(argv: list[str], versus: str) -> list[str]:
    """The second side's arguments: the first's, minus side-by-side flags, plus `--<override>` each."""
    own = ("--versus", "--rounds")
    base = [a for a in argv if not any(a == f or a.startswith(f + "=") for f in own)]
    overrides = [item.strip() for item in versus.split(",") if item.strip()]
    bad = [item for item in overrides if "=" not in item]
    if bad:
        raise ValueError(f"--versus items must be key=value, got {bad[0]!r}")
    return base + [f"--{item.lstrip('-')}" for item in overrides]


def run_side(argv: list[str]) -> dict:
    """One side in a fresh interpreter; its output passes through; returns its JSON summary."""
    command = [sys.executable, "-m", "poad_jax.bench", "e2e", *argv]
    print("$ " + " ".join(command[1:]), flush=True)
    lines = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        for line in process.stdout:
            print(line, end="", flush=True)
            lines.append(line)
    if process.returncode != 0 or not lines:
        raise RuntimeError(f"side failed with status {process.returncode}: {' '.join(argv)}")
    return json.loads(lines[-1])


def side_by_side(argv: list[str], versus: str, rounds: int) -> int:
    """Runs both sides `rounds` times (A B A B ...) and prints the B / A ratio of the medians."""
    try:
        sides = {"A": [a for a in argv if not a.startswith(("--versus", "--rounds"))],
                 "B": versus_argv(argv, versus)}
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    results: dict[str, list[dict]] = {"A": [], "B": []}
    for _ in range(rounds):
        for name, side_argv in sides.items():
            try:
                results[name].append(run_side(side_argv))
            except RuntimeError as error:
                print(f"error: {error}", file=sys.stderr)
                return 1
    median = {name: statistics.median(r["s_per_1k_env_steps"] for r in runs) for name, runs in results.items()}
    phases = (*PHASES, "other")
    by_phase = {
        name: {p: statistics.median(r["s_per_1k_by_phase"][p] for r in runs) for p in phases}
        for name, runs in results.items()
    }
    label = {name: f"{runs[0]['method']}{'' if runs[0]['share_prompt'] else ' (per candidate)'}"
             for name, runs in results.items()}
    print(f"\nside by side, median of {rounds} round(s), s per 1k env steps "
          f"({'warm' if results['A'][0]['warm'] else 'cold'}):")
    print(f"{'':32s} {'whole':>10s} " + " ".join(f"{p:>10s}" for p in phases))
    for name in ("A", "B"):
        print(f"{name + ': ' + label[name]:32s} {median[name]:10.1f} "
              + " ".join(f"{by_phase[name][p]:10.1f}" for p in phases))
    ratio = median["B"] / median["A"]
    print(f"{'B / A':32s} {ratio:10.2f} " + " ".join(
        f"{by_phase['B'][p] / by_phase['A'][p]:10.2f}" if by_phase["A"][p] > 0 else f"{'-':>10s}" for p in phases))
    for name in ("A", "B"):
        compiles = ", ".join(f"{r['compiles']['learner']}/{r['compiles']['sampler']}" for r in results[name])
        roof = ", ".join(f"{r['roofline']['percent']:.1f} %" for r in results[name] if r.get("roofline"))
        print(f"{name}: compilations learner/sampler per run {compiles}" + (f"; loop at {roof} of matmul peak"
                                                                               if roof else ""))
    print(f"B = A + {versus}")
    print(json.dumps({
        "bench": "e2e_versus",
        "versus": versus,
        "rounds": rounds,
        **{name.lower(): {"label": label[name], "s_per_1k_env_steps": round(median[name], 2),
                          "runs_s_per_1k_env_steps": [r["s_per_1k_env_steps"] for r in results[name]],
                          "compiles": [r["compiles"] for r in results[name]]} for name in ("A", "B")},
        "ratio_b_over_a": round(ratio, 3),
    }))
    return 0


def summarise(records: list[dict]) -> dict:
    """Seconds per 1k env steps, total and per phase, over `records`."""
    steps = sum(r["steps_this_update"] for r in records)
    seconds = {name: sum(r[f"seconds_{name}"] for r in records) for name in PHASES}
    wall = sum(r["seconds_wall"] for r in records)
    seconds["other"] = max(wall - sum(seconds.values()), 0.0)
    per_1k = {name: 1000.0 * s / steps for name, s in seconds.items()}
    return {
        "updates": len(records),
        "env_steps": steps,
        "wall_s": wall,
        "s_per_1k_env_steps": 1000.0 * wall / steps,
        "s_per_1k_by_phase": per_1k,
        "fraction": {name: s / wall for name, s in seconds.items()} if wall > 0 else {},
    }


def roofline(records: list[dict], matmul_gflops: float) -> dict | None:
    """Matmul work of `records` against a matmul throughput (GFLOP/s):

        GFLOP per env step = sum of flops_* / env steps / 1e9
        percent            = 100 x (FLOPs / wall seconds) / throughput   (the loop, and each phase
                             over its own seconds)

    None when the records hold no FLOP counts (older runs)."""
    if not records or any(field not in r for r in records for field in FLOP_PHASES.values()):
        return None
    steps = sum(r["steps_this_update"] for r in records)
    work = {phase: sum(r[field] for r in records) for phase, field in FLOP_PHASES.items()}
    wall = sum(r["seconds_wall"] for r in records)
    percent = lambda flops, seconds: 100.0 * flops / seconds / 1e9 / matmul_gflops if seconds > 0 else 0.0
    return {
        "gflop_per_env_step": sum(work.values()) / steps / 1e9,
        "matmul_gflops": matmul_gflops,
        "percent": percent(sum(work.values()), wall),
        "by_phase": {phase: {"gflop_per_env_step": flops / steps / 1e9,
                             "percent": percent(flops, sum(r[f"seconds_{phase}"] for r in records))}
                     for phase, flops in work.items()},
    }


def prepare_config(config, updates: int, share_prompt: bool) -> int:
    """Sets `config` up for a short timed run of `updates` updates (checkpoints, TensorBoard and
    plots off; enough env steps); returns the env steps per update.  ConfigError (one line) for a
    config the trainer would refuse (its settings are read typed, `run.config.typed`)."""
    from poad_jax.run import config as config_lib

    config_lib.validate(config)
    run = config_lib.typed(config)
    steps_per_update = run.rollout.num_threads * run.rollout.rollout_length
    config.total_env_steps = max(run.total_env_steps, updates * steps_per_update)
    config.tensorboard = False
    config.plot = False
    config.checkpoint_every = 10**9
    config.share_prompt = run.scheme.share_prompt and share_prompt
    return steps_per_update


def timed_training(config, workdir: str, updates: int, steps_per_update: int):
    """`train.run` for `updates` updates (in `workdir`, or a temporary one) with each logged record
    given its wall seconds since the previous one and its env steps; returns (the run's result,
    seconds of the whole call).  A `train.TrainError` passes through."""
    from poad_jax.run import metrics as run_logging
    from poad_jax.run import train

    # Wall time per update: wrap the logger so each record gets the time since the previous one.
    marks = {"last": None}
    original_log = run_logging.MetricsLogger.log

    def timed_log(self, record):
        now = time.perf_counter()
        record["seconds_wall"] = now - marks["last"]
        record["steps_this_update"] = steps_per_update
        marks["last"] = now
        return original_log(self, record)

    run_logging.MetricsLogger.log = timed_log
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = pathlib.Path(workdir or pathlib.Path(scratch) / "run")
        marks["last"] = time.perf_counter()
        start = marks["last"]
        try:
            result = train.run(config, run_dir, show_progress=False, max_updates=updates)
        finally:
            run_logging.MetricsLogger.log = original_log
        return result, time.perf_counter() - start


def print_table(run, records: list[dict], cold: dict, warm: dict | None, total_s: float) -> None:
    """Prints the run's description (`run`: the config typed, `run.config.typed`), the seconds per 1k
    env steps by phase (cold, and warm when there is more than one update) and the whole call's time,
    memory and compilations."""
    peak = max(r["peak_rss_mb"] for r in records)
    sharing = "" if run.method != "twosome" else (
        ", prompt shared" if run.scheme.share_prompt else ", per-candidate prompts")
    print(f"e2e: {run.name} ({run.env.name}), model {run.model}, method {run.method}{sharing}, "
          f"matmuls {run.matmul_dtype}, "
          f"{run.rollout.num_threads} threads x {run.rollout.rollout_length} steps per update, "
          f"max_new_tokens {run.sampling.max_new_tokens}, {len(records)} updates, CPU")
    header = f"{'':24s} {'s / 1k steps':>13s} " + " ".join(f"{name:>10s}" for name in (*PHASES, "other"))
    print(header)
    for label, summary in (("all updates (cold)", cold), ("updates 2+ (warm)", warm)):
        if summary is None:
            continue
        by_phase = summary["s_per_1k_by_phase"]
        print(f"{label:24s} {summary['s_per_1k_env_steps']:13.1f} "
              + " ".join(f"{by_phase[name]:10.1f}" for name in (*PHASES, "other")))
        print(f"{'  share of wall':24s} {'':13s} "
              + " ".join(f"{100 * summary['fraction'].get(name, 0):9.1f}%" for name in (*PHASES, "other")))
    print(f"whole call {total_s:.1f} s (including model loading); peak RSS {peak:.0f} MiB; "
          f"compilations: learner {records[-1]['compiles_learner']}, sampler {records[-1]['compiles_sampler']}")


def print_roofline(roof: dict, matmul_dtype: str, warm: bool) -> None:
    """Prints the GFLOP per env step and the loop's and each phase's fraction of the matmul peak."""
    phases = ", ".join(f"{phase} {v['gflop_per_env_step']:.3g} GFLOP at {v['percent']:.1f} %"
                       for phase, v in roof["by_phase"].items())
    print(f"roofline: {roof['gflop_per_env_step']:.3g} GFLOP per env step; measured matmul "
          f"{roof['matmul_gflops']:.0f} GFLOP/s ({matmul_dtype}); loop at {roof['percent']:.1f} % of that "
          f"({'warm' if warm else 'cold'}; {phases})")


def roofline_summary(roof: dict | None) -> dict | None:
    """The roofline figures for the JSON line, rounded."""
    if roof is None:
        return None
    return {
        "gflop_per_env_step": float(f"{roof['gflop_per_env_step']:.4g}"),
        "matmul_gflops": round(roof["matmul_gflops"], 1),
        "percent": round(roof["percent"], 2),
        "by_phase": {phase: {k: float(f"{x:.4g}") for k, x in v.items()} for phase, v in roof["by_phase"].items()}}


def run_summary(run, records: list[dict], cold: dict, warm: dict | None, roof: dict | None,
                steps_per_update: int) -> dict:
    """The JSON line of a single run (`run`: the config typed): the warm figures where there are any,
    else the cold ones."""
    headline = warm or cold
    return {
        "bench": "e2e",
        "config": run.name,
        "model": run.model,
        "method": run.method,
        "share_prompt": run.scheme.share_prompt,
        "matmul_dtype": run.matmul_dtype,
        "s_per_1k_env_steps": round(headline["s_per_1k_env_steps"], 2),
        "warm": warm is not None,
        "s_per_1k_by_phase": {k: round(v, 2) for k, v in headline["s_per_1k_by_phase"].items()},
        "cold_s_per_1k_env_steps": round(cold["s_per_1k_env_steps"], 2),
        "updates": len(records),
        "env_steps_per_update": steps_per_update,
        "peak_rss_mib": round(max(r["peak_rss_mb"] for r in records)),
        "compiles": {"learner": records[-1]["compiles_learner"], "sampler": records[-1]["compiles_sampler"]},
        "batch_prompt_len": sorted({r["batch_prompt_len"] for r in records}),
        "roofline": roofline_summary(roof),
        "load_average": round(os.getloadavg()[0], 2),
        "device": "cpu",
    }


def run_one(values) -> int:
    """Times one configuration in this process; prints its table and JSON line; returns the exit status."""
    from poad_jax.run import config as config_lib
    from poad_jax.run import hardware
    from poad_jax.run import train

    config = values.config
    updates = int(values.updates)
    if updates < 1:
        print("error: --updates must be >= 1", file=sys.stderr)
        return 2
    try:
        steps_per_update = prepare_config(config, updates, bool(values.share_prompt))
    except config_lib.ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from poad_jax.bench._machine import matmul_gflops

    chosen = hardware.resolve_config(config)  # "auto": the dtype this machine's run will use
    if chosen:
        print(chosen, flush=True)
    matmul_dtype = config.matmul_dtype  # resolved above: the dtype the run trains with
    peak_before = matmul_gflops(matmul_dtype)  # the ceiling: the better of before and after the run
    try:
        result, total_s = timed_training(config, values.workdir, updates, steps_per_update)
    except train.TrainError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    records = [r for r in result.records if "seconds_wall" in r]  # not those of a resumed run
    if not records:
        print("error: no update ran", file=sys.stderr)
        return 1
    # The first record's wall time also holds model loading and setup before the first rollout.
    run = result.settings  # the config as prepared and resolved, typed once by the run: what it trained with
    cold = summarise(records)
    warm = summarise(records[1:]) if len(records) > 1 else None
    print_table(run, records, cold, warm, total_s)
    roof = roofline(records[1:] if warm else records, max(peak_before, matmul_gflops(matmul_dtype)))
    if roof is not None:
        print_roofline(roof, matmul_dtype, warm is not None)
    print(json.dumps(run_summary(run, records, cold, warm, roof, steps_per_update)))
    return 0


def main(argv: list[str]) -> int:
    values = parse_or_report(parse, argv, __doc__)
    if values is None:
        return 2
    if values.versus:
        if int(values.rounds) < 1:
            print("error: --rounds must be >= 1", file=sys.stderr)
            return 2
        return side_by_side(argv, values.versus, int(values.rounds))
    return run_one(values)
