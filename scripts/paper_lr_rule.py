"""The pre-registered rule that picks the second group's actor lr (studies/virtualhome_paper_lr.py).

Reads the sweep's cells (`<workdir>/cells/actor_lr=<rate>__<METHOD>__seed=0/metrics.jsonl`), prints one
line per rate and the decision.  The rule, fixed before the sweep ran:
  a rate qualifies if an episode succeeded in at least one of its cells within the env steps read, and
  every one of its cells has a median per-update approx_kl <= 0.02 (the authors' skip threshold);
  the choice is the largest qualifying rate.  No qualifying rate: "extend" when some rate fails only for
  want of a success (every cell within the KL bound), else "lower" (add a rate below the smallest).

    python scripts/paper_lr_rule.py [--workdir=runs/studies/virtualhome_paper_lr] [--env-steps=1536]

Exit status: 0 a rate is chosen (printed last as `chosen: <rate>`), 3 extend the sweep, 4 add a lower
rate, 2 nothing to read.  Standard library only, so it reads any checkout's cells.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import re
import statistics
import sys

from poad_jax.run.metrics import read_metrics  # a raw snapshot's metrics.jsonl.gz too

KL_BOUND = 0.02
CELL_NAME = re.compile(r"actor_lr=(?P<rate>[0-9.eE+-]+)__(?P<method>[A-Za-z]+)__seed=(?P<seed>\d+)$")


@dataclasses.dataclass(frozen=True)
class CellSummary:
    rate: float
    method: str
    env_steps: int       # the last update read
    episodes: int
    successes: int       # steps that ended an episode with success, up to `env_steps`
    median_kl: float     # median over updates of approx_kl


def summarize(records: list[dict], rate: float, method: str, env_steps: int) -> CellSummary | None:
    """One cell's records up to `env_steps` (None without any)."""
    kept = [r for r in records if int(r.get("env_steps") or 0) <= env_steps]
    if not kept:
        return None
    last = kept[-1]
    return CellSummary(rate=rate, method=method, env_steps=int(last["env_steps"]),
                       episodes=int(last.get("episodes") or 0),
                       successes=int(last.get("steps_succeeded_total") or 0),
                       median_kl=float(statistics.median(float(r["approx_kl"]) for r in kept)))


def decide(cells: list[CellSummary]) -> tuple[str, float | None]:
    """("chosen", rate) | ("extend", None) | ("lower", None), by the rule in the module docstring."""
    rates = sorted({c.rate for c in cells}, reverse=True)
    within_kl = {rate: all(c.median_kl <= KL_BOUND for c in cells if c.rate == rate) for rate in rates}
    succeeded = {rate: any(c.successes > 0 for c in cells if c.rate == rate) for rate in rates}
    for rate in rates:
        if within_kl[rate] and succeeded[rate]:
            return "chosen", rate
    return ("extend", None) if any(within_kl.values()) else ("lower", None)


def read_cells(workdir: pathlib.Path, env_steps: int) -> list[CellSummary]:
    cells = []
    for cell_dir in sorted((workdir / "cells").glob("*")):
        match = CELL_NAME.match(cell_dir.name)
        if match is None:
            continue
        summary = summarize(read_metrics(cell_dir / "metrics.jsonl"), float(match["rate"]), match["method"],
                            env_steps)
        if summary is not None:
            cells.append(summary)
    return cells


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="runs/studies/virtualhome_paper_lr")
    parser.add_argument("--env-steps", type=int, default=1536, help="read each cell up to this many env steps")
    args = parser.parse_args(argv)
    cells = read_cells(pathlib.Path(args.workdir), args.env_steps)
    if not cells:
        print(f"error: no sweep cells with metrics under {args.workdir}/cells", file=sys.stderr)
        return 2
    for c in sorted(cells, key=lambda c: (-c.rate, c.method)):
        print(f"lr {c.rate:g} {c.method:8s} env steps {c.env_steps:5d}  episodes {c.episodes:3d}  "
              f"successes {c.successes:3d}  median KL {c.median_kl:.2e}")
    verdict, rate = decide(cells)
    print(f"chosen: {rate:g}" if verdict == "chosen" else f"decision: {verdict}")
    return {"chosen": 0, "extend": 3, "lower": 4}[verdict]


if __name__ == "__main__":
    sys.exit(main())
