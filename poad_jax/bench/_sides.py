"""Runs one side of a side-by-side benchmark in a fresh subprocess.

Each side gets its own process so that its peak RSS is its own; the child
prints one JSON object as its last line.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys


def run_side(bench: str, side: str, arguments: list[str], xla_flags: str = "") -> dict:
    """`python -m poad_jax.bench <bench> --side=<side> <arguments>`; returns its last-line JSON.

    `xla_flags` are appended to XLA_FLAGS for our (jax) side only."""
    command = [sys.executable, "-m", "poad_jax.bench", bench, f"--side={side}", *arguments]
    root = str(pathlib.Path(__file__).parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    if side == "jax" and xla_flags:
        env["XLA_FLAGS"] = " ".join(filter(None, [os.environ.get("XLA_FLAGS"), xla_flags]))
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"error: the {side} side failed (exit {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


def exit_status_or_sides(args, run_jax, run_torch) -> int | tuple[str, ...]:
    """A side-by-side benchmark's start: the exit status where it ends here (2: `args` is None, its
    arguments failed their checks; 0: in the child a side runs in, `--side=jax|torch`, after running
    that side on `args.directory` and printing its result as one JSON line), else the sides to run
    (`--sides=both|jax|torch`, ours first)."""
    if args is None:
        return 2
    if args.side:
        result = (run_jax if args.side == "jax" else run_torch)(args.directory, args)
        print(json.dumps(result))
        return 0
    return ("jax", "torch") if args.sides == "both" else (args.sides,)
