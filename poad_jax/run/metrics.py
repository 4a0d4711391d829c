"""Run logging: metrics JSONL, TensorBoard events, curve plots, summary table.

`metrics.jsonl` holds one JSON object per update (`update`, `env_steps`,
episode statistics, losses, timings); it is the source of truth: TensorBoard
events and `curves.png` are derived from the same records.
"""

from __future__ import annotations

import json
import math
import numbers
import pathlib
import textwrap
from typing import Any, Iterable

from poad_jax.run.logfiles import packed_path, read_log_text

EPISODE_WINDOW = 10  # episodes in the curves' rolling mean
CURVES = (
    ("episode_return", "episode return (dashed: discounted, the paper's App. H)"),
    ("success_rate", "episode success"),
    ("step_reward_mean", "mean step reward (per update)"),
    ("success_reward_mean", "mean reward of successful steps (e.g. AUC of programs that ran)"),
    ("best_step_reward", "best successful step (e.g. AUC)"),
    ("policy_loss", "policy loss"),
    ("value_loss", "value loss"),
    ("entropy", "entropy"),
    ("approx_kl", "approx KL"),
)


def _jsonable(value: Any) -> Any:
    """A JSON value: integers stay integers (`update`, `env_steps`), other
    numbers become floats, NaN and infinities become null."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return value
    return None if math.isnan(value) or math.isinf(value) else value


def jsonable_record(record: dict[str, Any]) -> dict[str, Any]:
    """`record` as `metrics.jsonl` stores it (see `_jsonable`)."""
    return {key: _jsonable(value) for key, value in record.items()}


class MetricsLogger:
    """Appends per-update metrics to `metrics.jsonl` (and TensorBoard).

    `write=False` (the processes other than 0 of a multi-process run) keeps
    the same interface and writes nothing: `log` returns the record as it
    would be stored, `truncate_after` reads the log without rewriting it.
    """

    def __init__(self, workdir: str | pathlib.Path, tensorboard: bool = True, write: bool = True):
        self.workdir = pathlib.Path(workdir)
        self.path = self.workdir / "metrics.jsonl"
        self.write = write
        self.writer = None
        if tensorboard and write:
            from tensorboardX import SummaryWriter

            self.writer = SummaryWriter(str(self.workdir / "tensorboard"))

    def truncate_after(self, update: int) -> list[dict[str, Any]]:
        """Drops records of updates > `update` (lost with a killed run); returns the rest."""
        records = read_metrics(self.path)
        kept = [r for r in records if r.get("update", 0) <= update]
        if len(kept) != len(records) or not self.path.exists():  # a packed log goes on plain, where `log` appends
            self.replace(kept)
        return kept

    def replace(self, records: list[dict[str, Any]]) -> None:
        """Rewrites `metrics.jsonl` to hold exactly `records` (atomically: a kill
        leaves the old file or the new one); a gzipped copy beside it goes, the plain file being the log."""
        if not self.write:
            return
        temporary = self.path.with_name(self.path.name + ".tmp")
        with open(temporary, "w") as f:
            for record in records:
                f.write(json.dumps(jsonable_record(record)) + "\n")
            f.flush()
        temporary.replace(self.path)
        packed_path(self.path).unlink(missing_ok=True)

    def log(self, record: dict[str, Any]) -> dict[str, Any]:
        """Appends `record`; returns it as stored (JSON types, NaN as null)."""
        record = jsonable_record(record)
        if not self.write:
            return record
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
        if self.writer is not None:
            step = int(record.get("env_steps", record.get("update", 0)))
            for key, value in record.items():
                if isinstance(value, float) and key not in ("update", "env_steps"):
                    self.writer.add_scalar(key, value, step)
            self.writer.flush()
        return record

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_metrics(path: str | pathlib.Path) -> list[dict[str, Any]]:
    """The records of `metrics.jsonl` at `path`, or of its gzipped copy `path.gz` (a raw snapshot's,
    `logfiles.read_log_text`); [] without either."""
    text = read_log_text(path)
    if text is None:
        return []
    records = []
    for line in text.splitlines():
        line = line.strip()
        if line:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a kill: ignore it
                continue
    return records


def rolling_mean(values: list[float], window: int) -> list[float]:
    """Mean of each value and up to `window - 1` values before it."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def episode_points(episodes: dict[str, list]) -> list[tuple[int, float, float]]:
    """(env step at the end, return, success) of each finished episode whose end is known."""
    return [
        (int(s), float(r), float(ok))
        for s, r, ok in zip(episodes.get("finished_env_steps", []), episodes.get("finished_returns", []),
                            episodes.get("finished_success", []))
        if s is not None and s >= 0
    ]


def discounted_points(episodes: dict[str, list]) -> list[tuple[int, float]]:
    """(env step at the end, discounted return) of each finished episode whose end and
    discounted return are known (older runs recorded neither for some)."""
    return [
        (int(s), float(d))
        for s, d in zip(episodes.get("finished_env_steps", []), episodes.get("finished_discounted", []))
        if s is not None and s >= 0 and d is not None and not math.isnan(float(d))
    ]


def panel_title(title: str, width: int = 44) -> str:
    """`title` on lines of at most `width` characters (one panel of the 3 x 3 grid holds about 50)."""
    return "\n".join(textwrap.wrap(title, width))


def plot_curves(records: list[dict[str, Any]], path: str | pathlib.Path,
                episodes: dict[str, list] | None = None, window: int = EPISODE_WINDOW) -> pathlib.Path | None:
    """Writes the run's curves against env steps to `path` (PNG).

    Return and success rate: one point per finished episode (from
    `episodes`, an `EpisodeStats.state_dict()`) with a rolling mean over
    `window` episodes, so a short run is a readable picture; the other
    panels: one point per update.
    """
    if not records:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 3, figsize=(14, 9.5))
    steps = [r.get("env_steps", 0) for r in records]
    points = episode_points(episodes or {})
    for ax, (key, title) in zip(axes.flat, CURVES):
        if key in ("episode_return", "success_rate") and episodes is not None:
            if points:
                xs = [p[0] for p in points]
                ys = [p[1] if key == "episode_return" else p[2] for p in points]
                ax.plot(xs, ys, "o", markersize=4, alpha=0.5, label="episode")
                ax.plot(xs, rolling_mean(ys, window), "-", label=f"mean of last {window}")
                if key == "episode_return":
                    discounted = discounted_points(episodes)
                    if discounted:
                        ax.plot([p[0] for p in discounted], rolling_mean([p[1] for p in discounted], window), "--",
                                label=f"discounted, mean of last {window}")
                ax.legend(loc="best", fontsize=8)
            else:
                ax.text(0.5, 0.5, "no episode finished yet", ha="center", va="center", transform=ax.transAxes)
        else:
            pairs = [(s, r.get(key)) for s, r in zip(steps, records) if r.get(key) is not None]
            if pairs:
                xs, ys = zip(*pairs)
                ax.plot(xs, ys, marker="o", markersize=4)
        ax.set_title(panel_title(title), fontsize=10)  # wrapped: a long title must not run past its panel
        ax.set_xlabel("env steps")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = pathlib.Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _number(value: Any, digits: int = 3) -> str:
    return f"{value:.{digits}f}"


def progress_postfix(episodes: dict[str, Any], approx_kl: float | None = None, window: int = 100,
                     nonfinite_steps: int = 0) -> dict[str, str]:
    """What the progress bar shows after the bar's count, from an `EpisodeStats.state_dict()`.

    Never a NaN: before the first episode ends it shows what happened so far
    (`ok`: steps that succeeded out of all, e.g. programs that ran;
    `best`: the best successful step's reward, e.g. the best AUC; `r/step`:
    mean step reward); returns and success appear once an episode ended;
    `nonfinite` counts the run's minibatch steps skipped for a non-finite loss
    or gradient, once there is one.
    """
    postfix: dict[str, str] = {}
    returns = episodes.get("finished_returns", [])[-window:]
    success = episodes.get("finished_success", [])[-window:]
    steps = int(episodes.get("steps", 0))
    postfix["episodes"] = str(len(episodes.get("finished_returns", [])))
    if returns:
        postfix["ret"] = _number(sum(returns) / len(returns))
        postfix["success"] = f"{sum(success) / len(success):.2f}"
    postfix["ok"] = f"{int(episodes.get('succeeded_steps', 0))}/{steps}"
    best = episodes.get("best_success_reward")
    if best is not None:
        postfix["best"] = _number(best)
    if steps:
        postfix["r/step"] = _number(float(episodes.get("reward_sum", 0.0)) / steps)
    if approx_kl is not None and math.isfinite(approx_kl):
        postfix["kl"] = f"{approx_kl:.3g}"
    if nonfinite_steps:
        postfix["nonfinite"] = str(int(nonfinite_steps))
    return postfix


def count_nonfinite_steps(records: list[dict[str, Any]]) -> int:
    """The minibatch steps of `records` skipped for a non-finite loss or gradient (older records lack the count)."""
    return sum(int(record.get("nonfinite_steps") or 0) for record in records)


def losses_were_finite(records: list[dict[str, Any]]) -> bool:
    """False when a minibatch step was skipped as non-finite, or an update's loss was (logged as null)."""
    if count_nonfinite_steps(records):
        return False
    return all(record.get(key) is not None and math.isfinite(float(record[key]))
               for record in records for key in ("policy_loss", "value_loss") if key in record)


def summary_table(records: list[dict[str, Any]], keys: Iterable[str] = (
    "env_steps", "episodes", "episode_return", "discounted_return", "success_rate", "steps_succeeded",
    "step_reward_mean",
    "success_reward_mean", "best_step_reward", "policy_loss", "value_loss",
    "entropy", "approx_kl", "clip_fraction", "explained_variance", "skipped_minibatches", "nonfinite_steps",
    "seconds_sampling", "seconds_env", "seconds_learner",
)) -> str:
    """A plain-text table of the first and the last update's key metrics (`-`: none, never NaN)."""
    if not records:
        return "(no updates)"
    first, last = records[0], records[-1]
    lines = [f"{'metric':<22}{'first update':>16}{'last update':>16}"]
    for key in keys:
        def fmt(value):
            if value is None or isinstance(value, float) and not math.isfinite(value):
                return "-"  # e.g. no episode finished in that update
            return f"{value:.4g}" if isinstance(value, float) else str(value)

        lines.append(f"{key:<22}{fmt(first.get(key)):>16}{fmt(last.get(key)):>16}")
    return "\n".join(lines)


def run_summary_lines(records: list[dict[str, Any]], episodes: dict[str, Any], total_env_steps: int,
                      unit: str = "steps", succeeded: str = "succeeded", reward: str = "reward",
                      learned: bool = True) -> list[str]:
    """What the run achieved, in words, from its records and `EpisodeStats.state_dict()`.

    `unit`, `succeeded` and `reward` name a step, its success and the
    reward of a successful step for the environment ("programs", "ran",
    "AUC" for DataSciCoding); `learned` False says the updates changed
    nothing (a run with `learn=False`).
    """
    if not records:
        return ["no PPO update finished."]
    last = records[-1]
    env_steps = int(last.get("env_steps", 0))
    where = "the run is complete" if env_steps >= total_env_steps else f"stopped early; total_env_steps is {total_env_steps}"
    updates = "PPO updates" if learned else "updates without learning (learn=False: the initial policy's actions)"
    lines = [f"{int(last.get('update', len(records)))} {updates} over {env_steps} env steps ({where})."]
    returns = list(episodes.get("finished_returns", []))
    success = list(episodes.get("finished_success", []))
    if returns:
        recent = returns[-EPISODE_WINDOW:]
        lines.append(
            f"{len(returns)} episodes finished: mean return {sum(returns) / len(returns):.3f} "
            f"(last {len(recent)}: {sum(recent) / len(recent):.3f}), {sum(success)} of {len(success)} succeeded."
        )
    else:
        lines.append(f"no episode finished within {env_steps} env steps; a longer run (--config.total_env_steps) lets episodes end.")
    steps = int(episodes.get("steps", 0))
    ok = int(episodes.get("succeeded_steps", 0))
    if steps:
        text = f"{ok} of {steps} {unit} {succeeded}"
        if ok:
            text += f" (mean {reward} of those {float(episodes.get('success_reward_sum', 0.0)) / ok:.3f})"
        text += f"; mean step reward {float(episodes.get('reward_sum', 0.0)) / steps:.3f}"
        best = episodes.get("best_success_reward")
        if best is not None:
            text += f"; best {best:.4f}"
        kinds = sorted(episodes.get("failure_kinds", {}).items(), key=lambda kv: (-kv[1], kv[0]))
        if kinds:
            text += "; failures: " + ", ".join(f"{kind} {count}" for kind, count in kinds[:4])
        stages = sorted(episodes.get("failure_stages", {}).items(), key=lambda kv: (-kv[1], kv[0]))
        if stages:
            text += "; failures by stage: " + ", ".join(f"{stage} {count}" for stage, count in stages)
        lines.append(text + ".")
    lines += episode_best_lines(episodes, reward)
    skipped = count_nonfinite_steps(records)
    if skipped:
        lines.append(f"{skipped} minibatch step(s) had a non-finite loss or gradient and changed nothing "
                     f"(updates {', '.join(str(r['update']) for r in records if r.get('nonfinite_steps'))[:80]}).")
    return lines


def episode_best_lines(episodes: dict[str, Any], reward: str = "AUC") -> list[str]:
    """The best `reward` of each finished episode that recorded one (DataSciCoding's improvement
    episodes, `EpisodeStats.finished_best`), in one line: their mean, the last few's and the highest; []
    for runs without."""
    bests = [float(b) for b in episodes.get("finished_best", []) if b is not None]
    if not bests:
        return []
    recent = bests[-EPISODE_WINDOW:]
    episodes_ran = f"{len(bests)} episode{'s' if len(bests) != 1 else ''}"
    return [f"best {reward} per improvement episode: mean {sum(bests) / len(bests):.4f} over the {episodes_ran} "
            f"where a program ran (last {len(recent)}: {sum(recent) / len(recent):.4f}; highest {max(bests):.4f})."]
