"""`python -m poad_jax.bench datasci`: sandboxed candidate evaluations per second.

For each dataset (balance_scale, spaceship_titanic), evaluates the same
batch of candidate programs sequentially and with the thread pool
(`evaluate_many`), and prints evaluations per second.  A dataset whose files
are missing is reported as skipped.  Imports no JAX.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from envs_py.datasci.datasets import DatasetError, load_dataset
from envs_py.datasci.sandbox import SandboxLimits, evaluate_candidate, evaluate_many, split_indices

DEFAULT_DATASETS = ("balance_scale", "spaceship_titanic")
DEFAULT_CANDIDATES = 8

# A mix of what an agent writes: quick linear models, forests, and failures.
PROGRAMS = (
    "from sklearn.linear_model import LogisticRegression\n"
    "def build_model(x_train, y_train):\n"
    "    return LogisticRegression(max_iter=1000).fit(x_train, y_train)\n",
    "from sklearn.ensemble import RandomForestClassifier\n"
    "def build_model(x_train, y_train):\n"
    "    return RandomForestClassifier(n_estimators=50, random_state=0).fit(x_train, y_train)\n",
    "from sklearn.tree import DecisionTreeClassifier\n"
    "def build_model(x_train, y_train):\n"
    "    return DecisionTreeClassifier(max_depth=5, random_state=0).fit(x_train, y_train)\n",
    "def build_model(x_train, y_train):\n"
    "    return undefined_name\n",
)


def _candidates(count: int) -> list[str]:
    return [PROGRAMS[i % len(PROGRAMS)] for i in range(count)]


def _measure(dataset: str, count: int, workers: int, limits: SandboxLimits, data_dir) -> dict:
    try:
        X, y = load_dataset(dataset, data_dir)
    except DatasetError as error:
        return {"dataset": dataset, "skipped": str(error)}
    codes = _candidates(count)
    splits = split_indices(len(y))
    start = time.perf_counter()
    sequential = [evaluate_candidate(code, X, y, limits, splits) for code in codes]
    sequential_s = time.perf_counter() - start
    start = time.perf_counter()
    pooled = evaluate_many(codes, X, y, limits, max_workers=workers)
    pooled_s = time.perf_counter() - start
    same = [r.auc_per_split for r in sequential] == [r.auc_per_split for r in pooled]
    return {
        "dataset": dataset,
        "rows": int(len(y)),
        "candidates": count,
        "workers": workers,
        "sequential_eval_per_s": count / sequential_s,
        "pool_eval_per_s": count / pooled_s,
        "speedup": sequential_s / pooled_s,
        "successes": sum(r.success for r in sequential),
        "same_scores": same,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m poad_jax.bench datasci", description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=list(DEFAULT_DATASETS))
    parser.add_argument("--candidates", type=int, default=DEFAULT_CANDIDATES, help="programs per dataset")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="pool size")
    parser.add_argument("--timeout", type=float, default=30.0, help="wall clock per candidate (s)")
    parser.add_argument("--data-dir", default=None, help="data directory (else $POAD_DATA_DIR, else the cache)")
    args = parser.parse_args(argv)
    limits = SandboxLimits(wall_seconds=args.timeout)
    rows = [_measure(name, args.candidates, args.workers, limits, args.data_dir) for name in args.datasets]
    print(f"{'dataset':<20}{'rows':>6}{'cands':>7}{'workers':>9}{'seq eval/s':>12}{'pool eval/s':>13}{'speedup':>9}{'ok':>5}")
    for row in rows:
        if "skipped" in row:
            print(f"{row['dataset']:<20} skipped: {row['skipped']}")
            continue
        print(f"{row['dataset']:<20}{row['rows']:>6}{row['candidates']:>7}{row['workers']:>9}"
              f"{row['sequential_eval_per_s']:>12.2f}{row['pool_eval_per_s']:>13.2f}{row['speedup']:>9.2f}"
              f"{row['successes']:>5}")
    summary = {"bench": "datasci", "cpu_count": os.cpu_count(), "results": rows}
    print(json.dumps(summary))
    return 0
