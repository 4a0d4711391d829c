"""`python -m poad_jax.bench datasci`: sandboxed candidate evaluations per second.

For each dataset (balance_scale, spaceship_titanic), evaluates the same
batch of candidate programs sequentially and with the thread pool
(`evaluate_many`), and prints evaluations per second.  Then it times the
honest program (the logistic regression) `--honest-runs` times on its own
(`evaluate_candidate`: a warm sandbox per program) and as the env runs it,
one after another in a kept warm sandbox (`WarmSession`), and prints the
median seconds per program of each.  `--cold` gives each split a sandbox and
an interpreter of its own (the path before issue 41), for side-by-side runs.
A dataset whose files are missing is reported as skipped.  Imports no JAX.
"""

from __future__ import annotations

import json
import os
import statistics
import time

from envs_py.datasci.datasets import DatasetError, load_dataset
from envs_py.datasci.sandbox import SandboxLimits, WarmSession, evaluate_candidate, evaluate_many, split_indices
from poad_jax.run.config.errors import ArgumentParser

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


def _honest_seconds(X, y, limits: SandboxLimits, splits, runs: int) -> tuple[list[float], list[float], bool]:
    """Seconds of the honest program: each on its own, then one after another in a kept sandbox; same scores?"""
    alone, aucs = [], set()
    for _ in range(runs):
        start = time.perf_counter()
        result = evaluate_candidate(PROGRAMS[0], X, y, limits, splits)
        alone.append(time.perf_counter() - start)
        aucs.add(result.auc_per_split)
    kept = []
    with WarmSession() as session:
        for _ in range(runs):
            start = time.perf_counter()
            result = session.evaluate(PROGRAMS[0], X, y, limits, splits)
            kept.append(time.perf_counter() - start)
            aucs.add(result.auc_per_split)
    return alone, kept, len(aucs) == 1 and result.success


def _measure(dataset: str, count: int, workers: int, limits: SandboxLimits, data_dir, honest_runs: int) -> dict:
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
    alone, kept, honest_same = _honest_seconds(X, y, limits, splits, honest_runs) if honest_runs else ([], [], True)
    return {
        "dataset": dataset,
        "rows": int(len(y)),
        "candidates": count,
        "workers": workers,
        "sequential_eval_per_s": count / sequential_s,
        "pool_eval_per_s": count / pooled_s,
        "speedup": sequential_s / pooled_s,
        "successes": sum(r.success for r in sequential),
        "same_scores": same and honest_same,
        "warm": limits.warm,
        "honest_s": statistics.median(alone) if alone else None,
        "honest_kept_s": statistics.median(kept) if kept else None,
        "honest_runs_s": alone,
        "honest_kept_runs_s": kept,
    }


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="python -m poad_jax.bench datasci", description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=list(DEFAULT_DATASETS))
    parser.add_argument("--candidates", type=int, default=DEFAULT_CANDIDATES, help="programs per dataset")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="pool size")
    parser.add_argument("--timeout", type=float, default=30.0, help="wall clock per candidate (s)")
    parser.add_argument("--data-dir", default=None, help="data directory (else $POAD_DATA_DIR, else the cache)")
    parser.add_argument("--honest-runs", type=int, default=3, help="timed runs of the honest program (0: none)")
    parser.add_argument("--cold", action="store_true", help="a sandbox and an interpreter per split (before issue 41)")
    args = parser.parse_args(argv)
    limits = SandboxLimits(wall_seconds=args.timeout, warm=not args.cold)
    rows = [_measure(name, args.candidates, args.workers, limits, args.data_dir, args.honest_runs)
            for name in args.datasets]
    print(f"path: {'cold (a sandbox per split)' if args.cold else 'warm (a zygote per sandbox, a fork per split)'}")
    print(f"{'dataset':<20}{'rows':>6}{'cands':>7}{'workers':>9}{'seq eval/s':>12}{'pool eval/s':>13}{'speedup':>9}"
          f"{'ok':>5}{'honest s':>10}{'kept s':>8}")
    for row in rows:
        if "skipped" in row:
            print(f"{row['dataset']:<20} skipped: {row['skipped']}")
            continue
        honest = "" if row["honest_s"] is None else f"{row['honest_s']:>10.2f}{row['honest_kept_s']:>8.2f}"
        print(f"{row['dataset']:<20}{row['rows']:>6}{row['candidates']:>7}{row['workers']:>9}"
              f"{row['sequential_eval_per_s']:>12.2f}{row['pool_eval_per_s']:>13.2f}{row['speedup']:>9.2f}"
              f"{row['successes']:>5}{honest}")
    summary = {"bench": "datasci", "cpu_count": os.cpu_count(), "warm": not args.cold, "results": rows}
    print(json.dumps(summary))
    return 0
