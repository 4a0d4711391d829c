"""`python -m poad_jax.bench backups`: jit `token_gae` against a NumPy per-token loop.

Both run on the same random BAD token streams (actions of 1-8 tokens,
episodes ending at random, ~5% padding) of shapes [128, 4096] and
[16, 65536], in one process.  Times are medians over repeats, warm-up
(compilation) excluded; jit timings include `block_until_ready`.

Rows:
  loop per token    the reference: a Python loop over every token of every
                    stream (NumPy scalar reads), as the reference code's
                    formulas are written.
  loop over T       the same loop vectorised over the batch (context only).
  jit token_gae     `jax.jit(gae.token_gae)` (reverse lax.scan).
  jit parallel      `jax.jit(gae.token_gae_parallel)` (associative scan).

The last line is `{"bench": "backups", "ratio": <median loop per token /
median jit token_gae on [128, 4096]>, ...}`; `ratio_best` compares the
fastest calls instead (less sensitive to other jobs on a shared machine).
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Callable

import jax
import numpy as np

from poad_jax.core import gae
from poad_jax.run.config.errors import ArgumentParser

SHAPES = ((128, 4096), (16, 65536))
GAMMA = 0.95
LAM = 0.95
MAX_ACTION_TOKENS = 8
DONE_PROBABILITY = 0.05
PAD_PROBABILITY = 0.05


def random_streams(seed: int, batch: int, length: int) -> dict[str, np.ndarray]:
    """Float32/bool BAD streams ``[batch, length]`` plus ``bootstrap_value [batch]``."""
    rng = np.random.default_rng(seed)
    action_end = np.zeros((batch, length), bool)
    for row in range(batch):
        ends = np.cumsum(rng.integers(1, MAX_ACTION_TOKENS + 1, size=length)) - 1
        action_end[row, ends[ends < length]] = True
    done = action_end & (rng.random((batch, length)) < DONE_PROBABILITY)
    rewards = np.where(action_end, rng.normal(size=(batch, length)), 0.0).astype(np.float32)
    values = rng.normal(size=(batch, length)).astype(np.float32)
    valid = rng.random((batch, length)) >= PAD_PROBABILITY
    discounts = np.asarray(gae.action_discounts(action_end, done, GAMMA))
    bootstrap = rng.normal(size=batch).astype(np.float32)
    return dict(rewards=rewards, values=values, discounts=discounts, valid=valid, bootstrap_value=bootstrap)


def gae_per_token_loop(rewards, values, discounts, valid, bootstrap_value, lam):
    """Reference: reverse Python loop over every token of every stream."""
    advantages = np.zeros_like(values)
    for row in range(values.shape[0]):
        next_value, next_advantage = bootstrap_value[row], 0.0
        for t in range(values.shape[1] - 1, -1, -1):
            if not valid[row, t]:
                continue
            delta = rewards[row, t] + discounts[row, t] * next_value - values[row, t]
            next_advantage = delta + discounts[row, t] * lam * next_advantage
            next_value = values[row, t]
            advantages[row, t] = next_advantage
    return advantages, np.where(valid, advantages + values, 0.0)


def gae_loop_over_time(rewards, values, discounts, valid, bootstrap_value, lam):
    """The same recursion, a Python loop over T vectorised over the batch."""
    advantages = np.zeros_like(values)
    next_value = bootstrap_value.copy()
    next_advantage = np.zeros_like(bootstrap_value)
    for t in range(values.shape[1] - 1, -1, -1):
        delta = rewards[:, t] + discounts[:, t] * next_value - values[:, t]
        advantage = delta + discounts[:, t] * lam * next_advantage
        next_value = np.where(valid[:, t], values[:, t], next_value)
        next_advantage = np.where(valid[:, t], advantage, next_advantage)
        advantages[:, t] = np.where(valid[:, t], advantage, 0.0)
    return advantages, np.where(valid, advantages + values, 0.0)


def wall_times(run: Callable[[], object], repeats: int) -> tuple[float, float]:
    """``(median, best)`` wall time of ``run()`` over ``repeats`` calls after one warm-up call."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def measure(batch: int, length: int, jit_repeats: int, loop_repeats: int, seed: int) -> dict:
    streams = random_streams(seed, batch, length)
    on_device = {name: jax.device_put(array) for name, array in streams.items()}
    scan = jax.jit(gae.token_gae)
    parallel = jax.jit(gae.token_gae_parallel)

    def block(outputs):
        return jax.block_until_ready(outputs)

    reference = gae_per_token_loop(**streams, lam=LAM)
    scan_out = block(scan(**on_device, lam=LAM))
    parallel_out = block(parallel(**on_device, lam=LAM))
    errors = {
        "scan": float(np.max(np.abs(np.asarray(scan_out[0]) - reference[0]))),
        "parallel": float(np.max(np.abs(np.asarray(parallel_out[0]) - reference[0]))),
    }
    timings = {
        "loop per token": wall_times(lambda: gae_per_token_loop(**streams, lam=LAM), loop_repeats),
        "loop over T": wall_times(lambda: gae_loop_over_time(**streams, lam=LAM), loop_repeats),
        "jit token_gae": wall_times(lambda: block(scan(**on_device, lam=LAM)), jit_repeats),
        "jit parallel": wall_times(lambda: block(parallel(**on_device, lam=LAM)), jit_repeats),
    }
    return {"shape": (batch, length), "timings": timings, "errors": errors}


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="python -m poad_jax.bench backups", description=__doc__.splitlines()[0])
    parser.add_argument("--jit-repeats", type=int, default=50, help="timed calls of each jit function")
    parser.add_argument("--loop-repeats", type=int, default=3, help="timed calls of each NumPy loop")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.jit_repeats < 1 or args.loop_repeats < 1:
        parser.error("repeats must be >= 1")

    results = [measure(b, t, args.jit_repeats, args.loop_repeats, args.seed) for b, t in SHAPES]
    print(f"token GAE on {jax.devices()[0].platform} ({jax.device_count()} device), gamma={GAMMA}, lambda={LAM}")
    header = f"{'shape':>12}  {'method':<15} {'median ms':>10} {'best ms':>9} {'loop/this':>10}  max|A - loop|"
    print(header)
    for result in results:
        shape = "x".join(str(n) for n in result["shape"])
        loop = result["timings"]["loop per token"][0]
        error = {"jit token_gae": result["errors"]["scan"], "jit parallel": result["errors"]["parallel"]}
        for method, (median, best) in result["timings"].items():
            error_text = f"{error[method]:.2e}" if method in error else ""
            print(f"{shape:>12}  {method:<15} {median * 1e3:>10.2f} {best * 1e3:>9.2f} {loop / median:>10.1f}  "
                  f"{error_text}")
    print("loop/this = median loop-per-token time / median time of the row")
    first, second = (result["timings"] for result in results)
    median = lambda timing: timing[0]
    summary = {
        "bench": "backups",
        "ratio": median(first["loop per token"]) / median(first["jit token_gae"]),
        "ratio_16x65536": median(second["loop per token"]) / median(second["jit token_gae"]),
        "ratio_parallel": median(first["loop per token"]) / median(first["jit parallel"]),
        "ratio_parallel_16x65536": median(second["loop per token"]) / median(second["jit parallel"]),
        "ratio_best": first["loop per token"][1] / first["jit token_gae"][1],
        "jit_ms": median(first["jit token_gae"]) * 1e3,
        "loop_ms": median(first["loop per token"]) * 1e3,
        "jit_ms_16x65536": median(second["jit token_gae"]) * 1e3,
        "loop_ms_16x65536": median(second["loop per token"]) * 1e3,
        "max_abs_error": max(max(r["errors"].values()) for r in results),
    }
    rounded = {k: round(v, 3) if isinstance(v, float) and k != "max_abs_error" else v for k, v in summary.items()}
    print(json.dumps(rounded))
    return 0
