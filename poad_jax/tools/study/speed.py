"""A study report's table of how soon each cell learns (report option `success_speed`): the env steps
to its first successful episode and to a success rate of r over its latest n episodes (0.5 over 16 by
default), seed by seed, per group; cells still running count where they have got to. Also the interval
that the reports give a count of successes (`wilson_interval`)."""

from __future__ import annotations

import math
import pathlib
from typing import Any

import numpy as np

from poad_jax.tools.study.scheduler import read_records, seed_major
from poad_jax.tools.study.spec import Study, grid, log_dir


def episodes_per_update(records: list[dict[str, Any]]) -> list[tuple[float, int, int]]:
    """(env steps, episodes finished, of them successful) per update with a known success rate:

        n_u = E_u - E_{u-1},   k_u = round(s_u n_u)   (E_0 = 0)

    E_u: episodes finished by update u; s_u: the success rate of those finished in it."""
    out, before = [], 0
    for record in records:
        finished = int(record.get("episodes") or 0)
        ended, before = finished - before, finished
        rate = record.get("success_rate")
        if ended > 0 and rate is not None and not math.isnan(float(rate)):
            out.append((float(record.get("env_steps") or 0), ended, int(round(float(rate) * ended))))
    return out


def steps_to_first_success(records: list[dict[str, Any]]) -> float:
    """min { env_steps_u : k_u > 0 } (`episodes_per_update`); NaN before any success."""
    return next((steps for steps, _, successes in episodes_per_update(records) if successes > 0), math.nan)


def steps_to_success_rate(records: list[dict[str, Any]], rate: float, episodes: int) -> float:
    """The env steps at the first update u whose latest episodes succeed at `rate` or more:

        min { env_steps_u : sum_{v=w..u} k_v >= rate * sum_{v=w..u} n_v },
        w = the latest update with sum_{v=w..u} n_v >= episodes

    (whole updates are taken back until they hold at least `episodes` episodes: the metrics record
    each update's count and rate, not the order of its episodes); NaN if it never happens."""
    updates = episodes_per_update(records)
    for last in range(len(updates)):
        counted = successes = 0
        for _, ended, won in reversed(updates[:last + 1]):
            counted, successes = counted + ended, successes + won
            if counted >= episodes:
                break
        if counted >= episodes and successes >= rate * counted:
            return updates[last][0]
    return math.nan


def _steps(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.0f}"


def _mean(values: list[float]) -> str:
    reached = [v for v in values if not math.isnan(v)]
    return f"{np.mean(reached):,.0f} ({len(reached)} of {len(values)})" if reached else f"- (0 of {len(values)})"


def success_speed_table(study: Study, workdir: pathlib.Path) -> list[str]:
    """Markdown lines, one row per group: env steps to the first success and to the success rate of the
    `success_speed` option, per seed and their mean over the seeds that got there; [] without the
    option or without any episode."""
    option = study.report_options.success_speed
    if option is None:
        return []
    rate, episodes = option.rate, option.episodes
    groups: dict[str, list[tuple[int, float, float]]] = {}  # group label -> (seed, first, rate) per cell
    any_episode = False
    for cell in seed_major(grid(study), study.seeds):
        records = read_records(log_dir(study, workdir, cell.name))
        if records:
            any_episode = any_episode or bool(episodes_per_update(records))
            groups.setdefault(cell.group_label, []).append(
                (cell.seed, steps_to_first_success(records), steps_to_success_rate(records, rate, episodes)))
    if not any_episode:
        return []
    lines = [f"How soon each cell learns (finished and running cells; '-': not yet): env steps to its first "
             f"successful episode, and to a success rate of {rate:g} or more over its latest {episodes} "
             "episodes (whole updates, taken back until they hold that many):", "",
             "| group | first success, per seed | mean (cells) | "
             f"success >= {rate:g} over {episodes} episodes, per seed | mean (cells) |", "|---|---|---|---|---|"]
    for label, rows in groups.items():
        first = ", ".join(f"{seed}: {_steps(steps)}" for seed, steps, _ in rows)
        half = ", ".join(f"{seed}: {_steps(steps)}" for seed, _, steps in rows)
        lines.append(f"| {label} | {first} | {_mean([r[1] for r in rows])} | {half} | "
                     f"{_mean([r[2] for r in rows])} |")
    return lines


def wilson_interval(successes: int, trials: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson's score interval for a binomial proportion p = k / n (95 % for the default z):

        (p + z^2 / 2n -+ z sqrt(p (1 - p) / n + z^2 / 4n^2)) / (1 + z^2 / n)

    (NaN, NaN) for n = 0.  Unlike p -+ z sqrt(p (1 - p) / n) it stays inside [0, 1] and is not empty at k = 0.
    """
    if trials <= 0:
        return float("nan"), float("nan")
    p, n = successes / trials, float(trials)
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    scale = 1 + z * z / n
    return max(0.0, (centre - half) / scale), min(1.0, (centre + half) / scale)
