"""`python -m poad_jax.bench envs`: environment steps per second, one core.

Steps every Overcooked and VirtualHome environment with a seeded uniform
random policy over the offered action strings (auto-reset on `done`) in this
one process and thread, and reports text-level steps per CPU second of this
process (macro steps for Overcooked, with the primitive steps they expand
into); CPU time rather than wall time keeps the figure honest on a machine
shared with other jobs.  Prompt text and
action tuples are built on every step, exactly as the trainer sees them.

Does not import JAX, so it starts fast.
"""

from __future__ import annotations

import json
import random
import sys
import time

import envs_py
from poad_jax.run.config.errors import ArgumentParser

TARGETS = {"overcooked": 1_000.0, "virtualhome": 10_000.0}  # steps/s the issue aims for


def default_names() -> tuple[str, ...]:
    """Every registered Overcooked and VirtualHome environment."""
    return tuple(name for name in envs_py.registry() if name.split("/")[0] in TARGETS)
def measure(name: str, seconds: float, seed: int) -> dict:
    """Steps `name` for about `seconds`; returns steps, episodes and rates."""
    env = envs_py.make(name)
    rng = random.Random(seed)
    obs = env.reset(seed=seed)
    steps = episodes = primitive = 0
    start = time.process_time()
    deadline = start + seconds
    while True:
        for _ in range(100):  # check the clock every 100 steps
            result = env.step(rng.choice(obs.actions))
            steps += 1
            primitive += result.info.get("primitive_steps", 1)
            if result.done:
                episodes += 1
                obs = env.reset(seed=seed + episodes)
            else:
                obs = result.observation
        now = time.process_time()
        if now >= deadline:
            break
    elapsed = now - start
    return {
        "steps": steps,
        "episodes": episodes,
        "seconds": elapsed,
        "steps_per_s": steps / elapsed,
        "primitive_steps_per_s": primitive / elapsed,
    }


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="python -m poad_jax.bench envs", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.5, help="CPU-time budget per environment")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--envs", nargs="*", default=None,
                        help="environment names (default: every Overcooked and VirtualHome env)")
    args = parser.parse_args(argv)
    if args.envs is None:
        args.envs = list(default_names())
    known = envs_py.registry()
    unknown = [n for n in args.envs if n not in known]
    if unknown:
        print(f"error: unknown environment(s) {', '.join(unknown)}; known: {', '.join(known)}", file=sys.stderr)
        return 2

    rows = {name: measure(name, args.seconds, args.seed) for name in args.envs}
    header = f"{'environment':42s} {'steps/s':>10s} {'prim/s':>10s} {'episodes':>9s} {'target':>8s}"
    print(header)
    print("-" * len(header))
    for name, row in rows.items():
        target = TARGETS.get(name.split("/", 1)[0])
        mark = "" if target is None else ("ok" if row["steps_per_s"] >= target else "LOW")
        print(f"{name:42s} {row['steps_per_s']:10.0f} {row['primitive_steps_per_s']:10.0f} "
              f"{row['episodes']:9d} {mark:>8s}")
    print(json.dumps({
        "bench": "envs",
        "unit": "text-level steps per CPU second, one core (Overcooked: macro steps)",
        "steps_per_s": {name: round(row["steps_per_s"], 1) for name, row in rows.items()},
        "primitive_steps_per_s": {
            name: round(row["primitive_steps_per_s"], 1) for name, row in rows.items() if name.startswith("overcooked/")
        },
    }))
    return 0
