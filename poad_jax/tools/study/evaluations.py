"""A study report's section on its cells' evaluations: the behaviour policy (the sampler that acted in
training) and the token policy PPO optimises, each played at the cell's final checkpoint
(`python -m poad_jax.evaluate [--policy=token]`), beside how far the two drifted apart in training."""

from __future__ import annotations

import math
import pathlib
from typing import Any

import numpy as np

from poad_jax.tools.study.scheduler import read_records, seed_major
from poad_jax.tools.study.spec import Study, grid, log_dir
from poad_jax.tools.study.speed import wilson_interval


def parse_evaluation(text: str, mode: str = "sampled") -> tuple[int, int] | None:
    """(successes, episodes) summed over the rows of one `mode` in an evaluate table (the saved
    `evaluation*.txt`: a `# command` line, a header, one row per environment and mode); None when it has
    no such row with episodes.  A row gives the success rate r to two decimals, so k = round(r n) is exact
    for n < 100 episodes (|k / n - r| <= 0.005); beyond, it is the nearest count."""
    lines = [line.split() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if not lines or lines[0][:1] != ["environment"]:
        return None
    columns = {name: index for index, name in enumerate(lines[0])}
    if not {"mode", "episodes", "success"} <= columns.keys():
        return None
    successes = episodes = 0
    for row in lines[1:]:
        if len(row) != len(columns) or row[columns["mode"]] != mode or row[columns["success"]] == "-":
            continue
        try:
            count, rate = int(row[columns["episodes"]]), float(row[columns["success"]])
        except ValueError:
            continue
        successes, episodes = successes + int(round(rate * count)), episodes + count
    return (successes, episodes) if episodes else None


def cell_evaluations(cell_dir: pathlib.Path) -> dict[str, tuple[int, int]]:
    """{policy: (successes, episodes)} of the sampled evaluations saved in a cell's directory."""
    from poad_jax.tools.evaluate import RESULTS_FILES  # here: the command's module loads JAX (1.5 s)

    found = {}
    for policy, name in RESULTS_FILES.items():
        path = cell_dir / name
        counts = parse_evaluation(path.read_text()) if path.is_file() else None
        if counts is not None:
            found[policy] = counts
    return found


def quarter_means(records: list[dict[str, Any]], key: str) -> tuple[float, float]:
    """Means of key over the first and the last quarter of the updates that logged it,
    (mean_{u <= U/4} x_u, mean_{u > 3U/4} x_u) with U = ceil(logged / 4) updates in each; NaNs if none."""
    values = np.array([float(r[key]) for r in records if r.get(key) is not None])
    values = values[~np.isnan(values)]
    if not len(values):
        return float("nan"), float("nan")
    quarter = math.ceil(len(values) / 4)
    return float(values[:quarter].mean()), float(values[-quarter:].mean())


def _counts(counts: tuple[int, int] | None) -> str:
    """'k of n (low-high)' with Wilson's 95 % interval, or '-'."""
    if counts is None:
        return "-"
    low, high = wilson_interval(*counts)
    return f"{counts[0]} of {counts[1]} ({low:.2f}-{high:.2f})"


def _path(pair: tuple[float, float], digits: int) -> str:
    return "-" if math.isnan(pair[0]) else f"{pair[0]:.{digits}f} -> {pair[1]:.{digits}f}"


def evaluation_section(study: Study, workdir: pathlib.Path) -> list[str]:
    """Markdown lines: per cell with a saved evaluation, the behaviour's and the token policy's successes
    (sampled episodes, Wilson's 95 % interval), and the training's KL(mu || pi_old) per action and mean
    truncated weight, first quarter -> last quarter of updates; then the counts pooled per group; []
    when no cell has been evaluated."""
    rows, pooled = [], {}
    for cell in seed_major(grid(study), study.seeds):
        cell_dir = log_dir(study, workdir, cell.name)
        found = cell_evaluations(cell_dir)
        if not found:
            continue
        records = read_records(cell_dir)
        rows.append(f"| {cell.name} | {_counts(found.get('behaviour'))} | {_counts(found.get('token'))} | "
                    f"{_path(quarter_means(records, 'behaviour_kl_action'), 2)} | "
                    f"{_path(quarter_means(records, 'importance_weight'), 3)} |")
        group = pooled.setdefault(cell.group, {"cells": 0})
        group["cells"] += 1
        for policy, (k, n) in found.items():
            had = group.get(policy, (0, 0))
            group[policy] = (had[0] + k, had[1] + n)
    if not rows:
        return []
    lines = ["Evaluation at each cell's final checkpoint, sampled episodes (`python -m poad_jax.evaluate`): "
             "the behaviour is the sampler that acted in training, the token policy the one PPO optimises "
             "(for a method that samples from its token policy the two are one; where only one was played, "
             "the other is '-'). Beside them, from training: KL(μ ‖ π_old) per action and the mean truncated "
             "weight min(1, π_old / μ), mean over the first -> the last quarter of updates (logged only with "
             "a behaviour correction). Interval: Wilson's 95 %.", "",
             "| cell | behaviour: successes | token policy: successes | KL(μ ‖ π_old) per action | "
             "mean truncated weight |", "|" + "---|" * 5] + rows
    lines += ["", "| group | cells evaluated | behaviour, pooled | token policy, pooled |", "|" + "---|" * 4]
    for group, counts in pooled.items():
        label = ", ".join(label for _, label in group)
        lines.append(f"| {label} | {counts['cells']} | {_counts(counts.get('behaviour'))} | "
                     f"{_counts(counts.get('token'))} |")
    return lines
