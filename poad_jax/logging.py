"""Run logging: metrics JSONL, TensorBoard events, curve plots, summary table.

`metrics.jsonl` holds one JSON object per update (`update`, `env_steps`,
episode statistics, losses, timings); it is the source of truth: TensorBoard
events and `curves.png` are derived from the same records.
"""

from __future__ import annotations

import json
import math
import pathlib
from typing import Any, Iterable

CURVES = (
    ("episode_return", "return"),
    ("success_rate", "success rate"),
    ("policy_loss", "policy loss"),
    ("value_loss", "value loss"),
    ("entropy", "entropy"),
    ("approx_kl", "approx KL"),
)


def _jsonable(value: Any) -> Any:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return value
    return None if math.isnan(value) or math.isinf(value) else value


class MetricsLogger:
    """Appends per-update metrics to `metrics.jsonl` (and TensorBoard)."""

    def __init__(self, workdir: str | pathlib.Path, tensorboard: bool = True):
        self.workdir = pathlib.Path(workdir)
        self.path = self.workdir / "metrics.jsonl"
        self.writer = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            self.writer = SummaryWriter(str(self.workdir / "tensorboard"))

    def truncate_after(self, update: int) -> list[dict[str, Any]]:
        """Drops records of updates > `update` (lost with a killed run); returns the rest."""
        records = read_metrics(self.path)
        kept = [r for r in records if r.get("update", 0) <= update]
        if len(kept) != len(records):
            with open(self.path, "w") as f:
                for record in kept:
                    f.write(json.dumps(record) + "\n")
        return kept

    def log(self, record: dict[str, Any]) -> None:
        record = {key: _jsonable(value) for key, value in record.items()}
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
        if self.writer is not None:
            step = int(record.get("env_steps", record.get("update", 0)))
            for key, value in record.items():
                if isinstance(value, float) and key not in ("update", "env_steps"):
                    self.writer.add_scalar(key, value, step)
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_metrics(path: str | pathlib.Path) -> list[dict[str, Any]]:
    path = pathlib.Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a kill: ignore it
                continue
    return records


def plot_curves(records: list[dict[str, Any]], path: str | pathlib.Path) -> pathlib.Path | None:
    """Writes return, success and loss curves against env steps to `path` (PNG)."""
    if not records:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5))
    steps = [r.get("env_steps", 0) for r in records]
    for ax, (key, title) in zip(axes.flat, CURVES):
        points = [(s, r.get(key)) for s, r in zip(steps, records) if r.get(key) is not None]
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o", markersize=3)
        ax.set_title(title)
        ax.set_xlabel("env steps")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = pathlib.Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def summary_table(records: list[dict[str, Any]], keys: Iterable[str] = (
    "env_steps", "episodes", "episode_return", "success_rate", "policy_loss", "value_loss",
    "entropy", "approx_kl", "clip_fraction", "explained_variance", "skipped_minibatches",
    "seconds_sampling", "seconds_env", "seconds_learner",
)) -> str:
    """A plain-text table of the first and the last update's key metrics."""
    if not records:
        return "(no updates)"
    first, last = records[0], records[-1]
    lines = [f"{'metric':<22}{'first update':>16}{'last update':>16}"]
    for key in keys:
        def fmt(value):
            if value is None:
                return "-"
            return f"{value:.4g}" if isinstance(value, float) else str(value)

        lines.append(f"{key:<22}{fmt(first.get(key)):>16}{fmt(last.get(key)):>16}")
    return "\n".join(lines)
