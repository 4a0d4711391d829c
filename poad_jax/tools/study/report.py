"""A study's report: aggregation over seeds, tables and provenance; the figures are `figures`."""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import pathlib
from typing import Any

import numpy as np

from poad_jax.tools.study.actions import actions_section
from poad_jax.tools.study.figures import plot_curves, plot_dynamics, plot_heatmap, plot_step_curves, smooth
from poad_jax.tools.study import page
from poad_jax.tools.study.programs import best_programs_section
from poad_jax.tools.study.scheduler import (cell_finished, format_seconds, read_json, read_records, repo_commit,
                                             seed_major, this_machine)
from poad_jax.tools.study.evaluations import evaluation_section
from poad_jax.tools.study.speed import (episodes_per_update, steps_to_first_success, success_speed_table,
                                        wilson_interval)
from poad_jax.tools.study.spec import (CELL_FILE, REPO, STUDY_FILE, Cell, Study, StudyError, cell_config, grid,
                                      log_dir)


def curve(records: list[dict[str, Any]], metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(env_steps, metric) per update; NaN where the update finished no episode."""
    steps = np.array([float(r.get("env_steps") or 0) for r in records])
    values = np.array([np.nan if r.get(metric) is None else float(r[metric]) for r in records])
    return steps, values


def final_value(records: list[dict[str, Any]], metric: str, fraction: float = 0.1) -> float:
    """Mean of `metric` over the updates in the last `fraction` of the run's env steps.

        final = mean { m_u : env_steps_u > (1 - fraction) * env_steps_last }   (NaNs skipped)
    """
    steps, values = curve(records, metric)
    if not len(steps):
        return float("nan")
    keep = (steps > (1.0 - fraction) * steps[-1]) & ~np.isnan(values)
    if not keep.any():  # too short a run: take the last update that has a value
        valid = ~np.isnan(values)
        return float(values[valid][-1]) if valid.any() else float("nan")
    return float(values[keep].mean())


def steps_to_threshold(records: list[dict[str, Any]], metric: str, threshold: float, window: int) -> float:
    """First env step at which the smoothed `metric` reaches `threshold` (NaN if never)."""
    steps, values = curve(records, metric)
    smoothed = smooth(values, window)
    hit = np.nonzero(smoothed >= threshold)[0]
    return float(steps[hit[0]]) if len(hit) else float("nan")


def mean_std(values: list[float]) -> tuple[float, float, int]:
    """Mean and sample standard deviation (ddof 1; 0 for one value) over the non-NaN values."""
    array = np.array([v for v in values if not math.isnan(v)])
    if not len(array):
        return float("nan"), float("nan"), 0
    return float(array.mean()), float(array.std(ddof=1)) if len(array) > 1 else 0.0, len(array)


# A study file's `report.theory` names "module:function"; study files written before the
# package's layers name the module where it was then.
MOVED_THEORY_MODULES = {"poad_jax.theory": "poad_jax.tools.theory"}


def _theory_fn(spec: str | None):
    if not spec:
        return None
    module_name, _, attr = spec.partition(":")
    module_name = MOVED_THEORY_MODULES.get(module_name, module_name)
    return getattr(importlib.import_module(module_name), attr)


@dataclasses.dataclass
class GroupResult:
    label: str
    group: tuple[tuple[str, str], ...]
    seeds: list[int]
    final_return: tuple[float, float, int]
    final_success: tuple[float, float, int]
    final_discounted: tuple[float, float, int]  # discounted_return (Appendix H's); count 0 where none is logged
    threshold_steps: list[float]
    theory: float | None
    curves: list[tuple[np.ndarray, np.ndarray]]
    success_curves: list[tuple[np.ndarray, np.ndarray]]
    finals: list[float] = dataclasses.field(default_factory=list)  # the final metric per seed, in `seeds`' order


def aggregate(study: Study, workdir: pathlib.Path) -> list[GroupResult]:
    """Per group (all axes but the seed), over its finished cells: final return/success over seeds,
    curves, threshold steps."""
    options = study.report_options
    metric, window, threshold, fraction = options.metric, options.smoothing, options.threshold, options.final_fraction
    theory = _theory_fn(options.theory)
    groups: dict[tuple, list[Cell]] = {}
    for cell in grid(study):
        groups.setdefault(cell.group, []).append(cell)
    results = []
    for group, cells in groups.items():
        finals, successes, discounted, reach, curves, success_curves, seeds = [], [], [], [], [], [], []
        for cell in cells:
            cell_dir = log_dir(study, workdir, cell.name)
            if not cell_finished(cell_dir, int(cell_config(study, cell).total_env_steps)):
                continue  # a running cell's last updates are not its final ones: it shows in the per-cell table
            records = read_records(cell_dir)
            seeds.append(cell.seed)
            finals.append(final_value(records, metric, fraction))
            successes.append(final_value(records, "success_rate", fraction))
            discounted.append(final_value(records, "discounted_return", fraction))
            if threshold is not None:
                reach.append(steps_to_threshold(records, metric, threshold, window))
            curves.append(curve(records, metric))
            success_curves.append(curve(records, "success_rate"))
        predicted = float(theory(cell_config(study, cells[0]))) if theory and cells else None
        results.append(GroupResult(
            label=", ".join(label for _, label in group), group=group, seeds=seeds,
            final_return=mean_std(finals), final_success=mean_std(successes),
            final_discounted=mean_std(discounted), threshold_steps=reach, theory=predicted, curves=curves,
            success_curves=success_curves, finals=finals,
        ))
    return results


def welch_test(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """Welch's t-test of two samples' means (unequal variances): (t, df, two-sided p),

        t = (mean_a - mean_b) / sqrt(v_a + v_b),   v_x = s_x^2 / n_x   (s_x: sample std, ddof 1)
        df = (v_a + v_b)^2 / (v_a^2 / (n_a - 1) + v_b^2 / (n_b - 1))   (Welch-Satterthwaite)
        p = 2 * P(T_df > |t|)

    NaN values are dropped; all three are NaN when either sample has fewer than two values or both
    have no spread."""
    x, y = (np.array([v for v in sample if not math.isnan(v)], float) for sample in (a, b))
    if len(x) < 2 or len(y) < 2:
        return math.nan, math.nan, math.nan
    va, vb = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    if va + vb == 0:
        return math.nan, math.nan, math.nan
    t = float((x.mean() - y.mean()) / math.sqrt(va + vb))
    df = float((va + vb) ** 2 / (va ** 2 / (len(x) - 1) + vb ** 2 / (len(y) - 1)))
    from scipy import stats  # noqa: PLC0415  (scikit-learn's dependency; only a report with pairs needs it)
    return t, df, float(2 * stats.t.sf(abs(t), df))


def pairs_table(results: list[GroupResult], pairs: tuple[tuple[str, str], ...], metric: str) -> list[str]:
    """Markdown lines, one row per pair of groups (report option `pairs`): the difference of their final
    `metric`'s means over seeds, the larger of the two seed stds, and Welch's t-test (`welch_test`) on
    the per-seed values of their finished cells; [] when no pair is asked for."""
    if not pairs:
        return []
    by_label = {r.label: r for r in results}
    lines = [f"Pairs of groups (final {metric} per seed of the finished cells; Welch's t-test, two-sided):", "",
             "| pair | seeds | difference of means | larger seed std | t | df | p |", "|" + "---|" * 7]
    for a, b in pairs:
        first, second = by_label[a], by_label[b]
        (mean_a, std_a, n_a), (mean_b, std_b, n_b) = mean_std(first.finals), mean_std(second.finals)
        t, df, p = welch_test(first.finals, second.finals)
        lines.append(f"| {a} - {b} | {n_a}, {n_b} | {_number(mean_a - mean_b)} | {_number(max(std_a, std_b))} | "
                     f"{_number(t)} | {'-' if math.isnan(df) else f'{df:.1f}'} | {_number(p)} |")
    return lines


FIGURES = ("return", "success", "heatmap", "steps", "dynamics")
PHASE_SECONDS = ("seconds_sampling", "seconds_env", "seconds_behaviour", "seconds_learner")


@dataclasses.dataclass
class CellSummary:
    """One cell's progress as its metrics.jsonl tells it (robust to interrupted sessions)."""
    name: str
    finished: bool
    env_steps: int
    total_env_steps: int
    episodes: int
    first_success: float  # env steps at the first update in which an episode succeeded; NaN if none yet
    final_return: float
    final_success: float
    seconds: float  # time in updates: the sum over updates of sampling, env, behaviour and learner seconds


def summarise_cell(study: Study, workdir: pathlib.Path, cell: Cell) -> CellSummary | None:
    """The cell's row of the per-cell table, or None before its first logged update.

        first_success = min { env_steps_u : success_rate_u > 0 } (`speed.steps_to_first_success`),
        seconds = sum_u sum_phase seconds_phase,u
    """
    cell_dir = log_dir(study, workdir, cell.name)
    records = read_records(cell_dir)
    if not records:
        return None
    total = int(cell_config(study, cell).total_env_steps)
    metric, fraction = study.report_options.metric, study.report_options.final_fraction
    return CellSummary(
        name=cell.name, finished=cell_finished(cell_dir, total), env_steps=int(records[-1].get("env_steps") or 0),
        total_env_steps=total, episodes=int(records[-1].get("episodes") or 0),
        first_success=steps_to_first_success(records),
        final_return=final_value(records, metric, fraction), final_success=final_value(records, "success_rate", fraction),
        seconds=float(sum(float(r.get(key) or 0.0) for r in records for key in PHASE_SECONDS)),
    )


def cell_table(study: Study, workdir: pathlib.Path) -> list[str]:
    """Markdown lines: one row per cell that has logged an update (finished or still running)."""
    metric = study.report_options.metric
    lines = ["| cell | status | env steps | episodes | first success at env step | "
             f"final {metric} | final success | time in updates |", "|" + "---|" * 8]
    for cell in seed_major(grid(study), study.seeds):
        row = summarise_cell(study, workdir, cell)
        if row is None:
            continue
        status = "done" if row.finished else f"running ({row.env_steps:,} of {row.total_env_steps:,})"
        seconds = format_seconds(row.seconds)
        if cell.name in study.same_as:
            status, seconds = f"not run: {study.same_as[cell.name]}'s numbers ({status})", "-"
        first = "-" if math.isnan(row.first_success) else f"{row.first_success:,.0f}"
        so_far = "" if row.finished else " (so far)"
        lines.append(f"| {row.name} | {status} | {row.env_steps:,} | {row.episodes:,} | {first} | "
                     f"{_number(row.final_return)}{so_far} | {_number(row.final_success)}{so_far} | {seconds} |")
    return lines


@dataclasses.dataclass
class StepOutcomes:
    """One cell's steps that succeeded (e.g. programs that ran) and what they scored (e.g. their AUC)."""
    steps: int
    succeeded: int
    mean_reward: float  # over every succeeded step of the run
    final_mean_reward: float  # over the succeeded steps of the updates in the last `final_fraction`
    best_reward: float
    cut_off: int | None = None  # actions the token limit ended (`actions_cut_off`); None unless every update logged it


def step_outcomes(records: list[dict[str, Any]], fraction: float) -> StepOutcomes:
    """Counts and rewards of the succeeded steps, weighted by step (not by update):

        mean = sum_u k_u * rbar_u / sum_u k_u   (k_u = steps_succeeded_u, rbar_u = success_reward_mean_u)
        final mean: the same sum over { u : env_steps_u > (1 - fraction) * env_steps_last }
    """
    steps = np.array([float(r.get("env_steps") or 0) for r in records])
    counts = np.array([float(r.get("steps_succeeded") or 0) for r in records])
    means = np.array([np.nan if r.get("success_reward_mean") is None else float(r["success_reward_mean"])
                      for r in records])
    counted = (counts > 0) & ~np.isnan(means)

    def weighted(keep: np.ndarray) -> float:
        keep = keep & counted
        return float((counts[keep] * means[keep]).sum() / counts[keep].sum()) if keep.any() else float("nan")

    best = [float(r["best_step_reward"]) for r in records if r.get("best_step_reward") is not None]
    cut = [r.get("actions_cut_off") for r in records]
    return StepOutcomes(
        steps=int(steps[-1]) if len(steps) else 0, succeeded=int(counts.sum()),
        mean_reward=weighted(np.ones(len(records), bool)),
        final_mean_reward=weighted(steps > (1.0 - fraction) * (steps[-1] if len(steps) else 0.0)),
        best_reward=max(best) if best else float("nan"),
        cut_off=sum(int(c) for c in cut) if cut and None not in cut else None,  # a partial sum would mislead
    )


def step_outcome_table(study: Study, workdir: pathlib.Path) -> list[str]:
    """Markdown lines, one row per cell, from report option `steps = {"succeeded": name, "reward": name}`
    (e.g. runnable programs and their AUC on DataSciCoding); [] when the study does not ask for it."""
    names = study.report_options.steps
    if names is None:
        return []
    succeeded, reward = names.succeeded, names.reward
    fraction = study.report_options.final_fraction
    lines = [f"Steps per cell ({succeeded} steps and their {reward}; means weighted by step):", "",
             f"| cell | status | env steps | {succeeded} | fraction {succeeded} | mean {reward} of {succeeded} | "
             f"same, last {fraction:.0%} of env steps | best {reward} | cut off by the token limit |",
             "|" + "---|" * 9]
    for cell in seed_major(grid(study), study.seeds):
        cell_dir = log_dir(study, workdir, cell.name)
        records = read_records(cell_dir)
        if not records:
            continue
        total = int(cell_config(study, cell).total_env_steps)
        row = step_outcomes(records, fraction)
        status = "done" if cell_finished(cell_dir, total) else f"running ({row.steps:,} of {total:,})"
        share = row.succeeded / row.steps if row.steps else float("nan")
        lines.append(f"| {cell.name} | {status} | {row.steps:,} | {row.succeeded:,} | {_number(share)} | "
                     f"{_number(row.mean_reward)} | {_number(row.final_mean_reward)} | {_number(row.best_reward)} | "
                     f"{'-' if row.cut_off is None else f'{row.cut_off:,}'} |")
    return lines


def step_successes(records: list[dict[str, Any]], fraction: float) -> tuple[int, int]:
    """Succeeded and taken env steps of a run's updates in the last `fraction` of its env steps:

        k = sum_{u in U} k_u,   n = sum_{u in U} (T_u - T_{u-1})   (T_0 = 0)

    with k_u = steps_succeeded_u (e.g. programs that ran), T_u the env steps after update u, and
    U = { u : T_u > (1 - fraction) * T_last }, as `final_value` takes them."""
    taken = [float(r.get("env_steps") or 0) for r in records]
    if not taken:
        return 0, 0
    since = (1.0 - fraction) * taken[-1]
    k = n = 0
    for before, after, record in zip([0.0, *taken[:-1]], taken, records):
        if after > since:
            k += int(record.get("steps_succeeded") or 0)
            n += int(after - before)
    return k, n


def final_step_count_table(study: Study, workdir: pathlib.Path) -> list[str]:
    """Markdown lines (report option `steps`): per group, the succeeded env steps of its finished cells in
    the last `final_fraction` of their env steps (`step_successes`), pooled over seeds, with Wilson's 95 %
    interval: per env step, so that methods whose episodes differ in length compare alike.  [] when the
    study does not ask for it or before a finished cell."""
    names = study.report_options.steps
    if names is None:
        return []
    fraction = study.report_options.final_fraction
    groups: dict[tuple, list[tuple[int, int, int]]] = {}  # group -> [(seed, succeeded, env steps)]
    for cell in seed_major(grid(study), study.seeds):
        cell_dir = log_dir(study, workdir, cell.name)
        if cell_finished(cell_dir, int(cell_config(study, cell).total_env_steps)):
            groups.setdefault(cell.group, []).append((cell.seed, *step_successes(read_records(cell_dir), fraction)))
    return _pooled_success_table(f"{names.succeeded.capitalize()} env steps in the last {fraction:.0%} of env steps, "
                                 "per group, pooled over its finished cells (interval: Wilson's 95 %):",
                                 "finished cells", groups, counted="env steps", succeeded=names.succeeded)


def episode_successes(records: list[dict[str, Any]], fraction: float | None = None) -> tuple[int, int]:
    """Successful and counted episodes of a run, from its per-update success rates:

        k = sum_{u in U} round(s_u * (E_u - E_{u-1})),   n = sum_{u in U} (E_u - E_{u-1})   (E_0 = 0)

    where E_u is the episodes finished by update u and s_u the success rate of those finished in it;
    updates whose rate is unknown (None or NaN) count in neither (`speed.episodes_per_update`).  U is every
    update, or with `fraction` those in the last `fraction` of the run's env steps, as `final_value` takes
    them: { u : env_steps_u > (1 - fraction) * env_steps_last }.
    """
    updates = episodes_per_update(records)
    if fraction is not None and records:
        since = (1.0 - fraction) * float(records[-1].get("env_steps") or 0)
        updates = [u for u in updates if u[0] > since]
    return sum(won for _, _, won in updates), sum(ended for _, ended, _ in updates)


def _pooled_success_table(title: str, cells_column: str, groups: dict[tuple, list[tuple[int, int, int]]],
                          counted: str = "episodes", succeeded: str = "successful") -> list[str]:
    """A titled table, one row per group from its cells' (seed, successes, counted): the pooled k / n and
    Wilson's 95 %; [] when no cell has counted anything (the columns name what is counted: episodes, or
    env steps and e.g. the runnable ones)."""
    if not any(n for counts in groups.values() for _, _, n in counts):
        return []
    lines = [title, "", f"| group | {cells_column} | {counted} | {succeeded} | {succeeded} per seed | rate | "
             "95 % interval |", "|" + "---|" * 7]
    for group, counts in groups.items():
        k, n = sum(c[1] for c in counts), sum(c[2] for c in counts)
        low, high = wilson_interval(k, n)
        label = ", ".join(label for _, label in group)
        lines.append(f"| {label} | {len(counts)} | {n:,} | {k:,} | {', '.join(f'{s}: {c}' for s, c, _ in counts)} | "
                     f"{_number(k / n) if n else '-'} | {f'{_number(low)}-{_number(high)}' if n else '-'} |")
    return lines


def success_count_table(study: Study, workdir: pathlib.Path) -> list[str]:
    """Markdown lines: per group, successful episodes over all its cells (finished and running), pooled
    over seeds, with Wilson's 95 % interval; [] when no cell has a known success rate.  Pooling treats
    the seeds' episodes as one sample: the interval shows how few successes a rate rests on, not the
    spread between seeds (the seed bands show that)."""
    groups: dict[tuple, list[tuple[int, int, int]]] = {}  # group -> [(seed, successes, episodes)]
    for cell in seed_major(grid(study), study.seeds):
        records = read_records(log_dir(study, workdir, cell.name))
        if records:
            groups.setdefault(cell.group, []).append((cell.seed, *episode_successes(records)))
    return _pooled_success_table("Successful episodes per group, pooled over its cells so far (finished and "
                                 "running; interval: Wilson's 95 %):", "cells", groups)


def final_success_count_table(study: Study, workdir: pathlib.Path) -> list[str]:
    """Markdown lines: per group, the successful episodes of its finished cells in the last `final_fraction`
    of their env steps (`episode_successes`), pooled over seeds, with Wilson's 95 % interval: what a rule
    "the final successes' interval lies above the untrained policy's rate" reads.  [] before a finished cell
    with a known success rate."""
    fraction = study.report_options.final_fraction
    groups: dict[tuple, list[tuple[int, int, int]]] = {}  # group -> [(seed, successes, episodes)]
    for cell in seed_major(grid(study), study.seeds):
        cell_dir = log_dir(study, workdir, cell.name)
        if cell_finished(cell_dir, int(cell_config(study, cell).total_env_steps)):
            groups.setdefault(cell.group, []).append((cell.seed, *episode_successes(read_records(cell_dir),
                                                                                    fraction)))
    return _pooled_success_table(f"Successful episodes in the last {fraction:.0%} of env steps, per group, pooled "
                                 "over its finished cells (interval: Wilson's 95 %):", "finished cells", groups)


@dataclasses.dataclass
class Dynamics:
    """How a cell's policy moved, update by update (PPO's own diagnostics)."""
    updates: int
    median_kl: float
    max_kl: float
    entropy: tuple[float, float, float]  # at the first update, half-way, the last
    explained_variance: tuple[float, float]  # the critic's: median and min over updates (NaN if not logged)
    skipped: int  # minibatch steps the KL threshold skipped
    steps: int  # minibatch steps in all (skipped ones included)
    median_seconds: float  # per update, sampling + env + behaviour + learner
    no_policy_gradient: bool = False  # advantages, yet the policy loss exactly 0 in every update
    no_advantage: bool = False  # every advantage 0 in every update: no return differed from its baseline


def training_dynamics(records: list[dict[str, Any]]) -> Dynamics | None:
    """Medians and extremes over updates u of approx_kl_u, of the critic's explained_variance_u (none
    when value_loss_u is 0 in every update: no critic trained) and of t_u = sum_phase seconds_phase,u;
    entropy at updates 1, ceil(U / 2), U; skipped = sum_u skipped_minibatches_u and, with f_u =
    skipped_u their fraction, steps = sum_u skipped_minibatches_u / f_u over the updates with f_u > 0,
    else their count / f taken from any update's epochs x minibatches (None when the records carry no
    approx_kl).  no_policy_gradient: policy_loss_u == 0 exactly for every u that logged it although
    advantage_mean_u != 0 for some u (the advantages were normalised away; a run with no reward yet,
    whose advantages are all 0, is not flagged).  no_advantage: that run, every advantage 0 in every
    update: groups_with_signal_u == 0 for every u where a group method logged it, else advantage_mean_u
    == 0 exactly for every u that logged one."""
    kept = [r for r in records if r.get("approx_kl") is not None and not math.isnan(float(r["approx_kl"]))]
    if not kept:
        return None
    kl = np.array([float(r["approx_kl"]) for r in kept])
    entropy = [float(r.get("entropy", float("nan"))) for r in kept]
    seconds = [sum(float(r.get(key) or 0.0) for key in PHASE_SECONDS) for r in kept]
    variance = np.array([float(r["explained_variance"]) for r in kept if r.get("explained_variance") is not None])
    value_losses = [float(r["value_loss"]) for r in kept if r.get("value_loss") is not None]
    if value_losses and all(loss == 0.0 for loss in value_losses):
        variance = variance[:0]  # no critic trained (GRPO, GiGPO): its explained variance says nothing
    variance = variance[~np.isnan(variance)]
    skipped = [int(round(float(r.get("skipped_minibatches") or 0))) for r in kept]
    fractions = [float(r.get("skipped") or 0.0) for r in kept]
    per_update = {round(k / f) for k, f in zip(skipped, fractions) if k > 0 and f > 0}
    steps = per_update.pop() * len(kept) if len(per_update) == 1 else 0
    policy_losses = [float(r["policy_loss"]) for r in kept if r.get("policy_loss") is not None]
    advantages = any(float(r.get("advantage_mean") or 0.0) != 0.0 for r in kept)
    signals = [r["groups_with_signal"] for r in kept if r.get("groups_with_signal") is not None]
    logged = any(r.get("advantage_mean") is not None for r in kept)
    no_advantage = all(k == 0 for k in signals) if signals else logged and not advantages
    return Dynamics(updates=len(kept), median_kl=float(np.median(kl)), max_kl=float(kl.max()),
                    entropy=(entropy[0], entropy[(len(kept) - 1) // 2], entropy[-1]),
                    explained_variance=(float(np.median(variance)), float(variance.min())) if len(variance)
                    else (float("nan"), float("nan")), skipped=int(sum(skipped)),
                    steps=steps, median_seconds=float(np.median(seconds)),
                    no_policy_gradient=advantages and bool(policy_losses)
                    and all(loss == 0.0 for loss in policy_losses), no_advantage=no_advantage)


def dynamics_table(study: Study, workdir: pathlib.Path) -> list[str]:
    """Markdown lines, one row per cell with PPO diagnostics: median (max) per-update approx KL, the
    entropy's path, the critic's median (min) explained variance, minibatch steps skipped by the KL
    threshold, median time per update; then a warning naming the cells whose policy loss was exactly 0
    in every update although they had advantages (`Dynamics.no_policy_gradient`), one naming those whose
    every advantage was 0 (`Dynamics.no_advantage`; both of finished cells only: a running cell is marked
    so in its row), and a line naming the cells that logged updates without a learner's (a run with
    `learn=False`); [] without any row."""
    lines = ["Training dynamics per cell (approx KL and entropy as the learner logs them: per token for "
             "token-level methods, per action for TWOSOME):", "",
             "| cell | updates | median (max) approx KL | entropy: first -> half-way -> last update | "
             "critic's explained variance: median (min) | minibatch steps skipped | median time per update |",
             "|" + "---|" * 7]
    rows, flat, unlearned, silent = 0, [], [], []
    for cell in seed_major(grid(study), study.seeds):
        cell_dir = log_dir(study, workdir, cell.name)
        records = read_records(cell_dir)
        row = training_dynamics(records)
        if row is None:
            unlearned += [cell.name] if records else []
            continue
        rows += 1
        finished = cell_finished(cell_dir, int(cell_config(study, cell).total_env_steps))
        flat += [cell.name] if row.no_policy_gradient and finished else []
        silent += [cell.name] if row.no_advantage and finished else []
        skipped = f"{row.skipped} of {row.steps}" if row.steps else str(row.skipped)
        lines.append(f"| {cell.name}{'' if finished else ' (running)'} | {row.updates} | {row.median_kl:.2g} ({row.max_kl:.2g}) | "
                     + " -> ".join(f"{e:.2f}" for e in row.entropy)
                     + f" | {_number(row.explained_variance[0])} ({_number(row.explained_variance[1])})"
                     + f" | {skipped} | {format_seconds(row.median_seconds)} |")
    if flat:
        lines += ["", f"**No policy gradient** in {', '.join(flat)}: the policy loss is exactly 0 in every update "
                  "although the advantages were not (normalised away, e.g. one row per loss chunk; "
                  "docs/adrl_parity.md), so the actor moved by its entropy bonus alone and these cells say "
                  "nothing about their method."]
    if silent:
        lines += ["", f"**Every advantage 0** in every update of {', '.join(silent)}: no trajectory's return "
                  "differed from its baseline (for GRPO and GiGPO, no episode group had trajectories whose returns "
                  "differ), so the policy loss had no gradient and only the entropy bonus or a KL penalty moved "
                  "the actor; these cells show their method never met a reward it could learn from, not how it "
                  "learns."]
    if unlearned:
        lines += ["", f"No learner ran in {', '.join(unlearned)}: their updates log no approx KL (a run with "
                  "`learn=False` samples from its initial policy throughout)."]
    return lines if rows else []


MACHINERY_KEYS = ("seconds_", "compiles_", "peak_rss_mb")  # what the machine and the process change, not the run


def learning_numbers(records: list[dict[str, Any]]) -> str:
    """Every update's logged values but the machinery's (keys starting with one of `MACHINERY_KEYS`:
    timings, compile counts, memory), as one canonical JSON text: equal texts, equal runs."""
    return json.dumps([{k: v for k, v in r.items() if not k.startswith(MACHINERY_KEYS)} for r in records],
                      sort_keys=True)


def same_numbers_lines(study: Study, workdir: pathlib.Path) -> list[str]:
    """Markdown lines naming the finished cells that logged the same learning numbers in every update
    (`learning_numbers`) as another finished cell, each set of them once; [] when there are none.
    Different settings with the same numbers mean the difference changed nothing in these runs: an
    option without effect, a seed that reaches nothing random, or two methods that coincide (GRPO and
    GiGPO while every advantage is 0)."""
    runs: dict[str, list[str]] = {}
    for cell in seed_major(grid(study), study.seeds):
        if cell.name in study.same_as:  # not run: its numbers are another cell's by declaration
            continue
        cell_dir = workdir / "cells" / cell.name
        records = read_records(cell_dir)
        if records and cell_finished(cell_dir, int(cell_config(study, cell).total_env_steps)):
            runs.setdefault(learning_numbers(records), []).append(cell.name)
    same = [names for names in runs.values() if len(names) > 1]
    return [f"**Same numbers** in {', '.join(names[:-1])} and {names[-1]}: every update logged the same value "
            "of every metric (timings, compile counts and memory aside), so what their settings differ in changed "
            "nothing in these runs (an option without effect here, a seed that reaches nothing random, or methods "
            "that coincide on these runs, as GRPO and GiGPO do while every advantage is 0)."
            for names in same]


def not_run_lines(study: Study) -> list[str]:
    """A markdown line naming the cells the study does not run (`same_as`), each with the cell whose
    numbers stand for it in every table and figure; [] when there are none."""
    names = {cell.name for cell in grid(study)}  # a report of some seeds names those seeds' cells only
    pairs = [f"{name} ({source}'s)" for name, source in study.same_as.items() if name in names]
    if not pairs:
        return []
    return [f"**Not run**, as the same computation as a cell that ran (the study file's `same_as`), whose numbers "
            f"stand for them in every table and figure: {', '.join(pairs)}."]


def _number(x: float) -> str:
    """A table cell: three decimals, or "-" for NaN."""
    return "-" if math.isnan(x) else f"{x:.3f}"


def _fmt(mean: float, std: float, count: int) -> str:
    if count == 0 or math.isnan(mean):
        return "-"
    return f"{mean:.3f} ± {std:.3f}"


def _commits_line(study: Study, workdir: pathlib.Path) -> str:
    """Which commits the study's own cells ran at (a resumed cell may list several), from cell.json."""
    commits: dict[str, int] = {}
    unrecorded = 0
    for cell in grid(study):
        cell_dir = workdir / "cells" / cell.name
        if cell_dir.is_symlink() or not cell_dir.exists():
            continue
        recorded = (read_json(cell_dir / CELL_FILE) or {}).get("commits") or []
        unrecorded += not recorded
        for commit in recorded:
            commits[commit] = commits.get(commit, 0) + 1
    parts = [f"{commit} ({count} cell{'s' if count > 1 else ''})" for commit, count in commits.items()]
    if unrecorded:
        parts.append(f"not recorded for {unrecorded} cell{'s' if unrecorded > 1 else ''} (run before cell.json kept it)")
    return "the cells' commits: " + (", ".join(parts) if parts else "none yet")


def provenance(study: Study, workdir: pathlib.Path) -> str:
    """One markdown line: command, commits, machine, date and wall time of the study's cells."""
    data = read_json(workdir / STUDY_FILE) or {}
    sessions = data.get("sessions", [])
    wall = sum(s.get("seconds", 0.0) for s in sessions)
    cut_off = sum(not s.get("ended", True) for s in sessions)  # entries written before `ended` existed ended
    cell_seconds = 0.0
    reused = 0
    for cell in grid(study):
        cell_dir = workdir / "cells" / cell.name
        if cell_dir.is_symlink():
            reused += 1
            continue
        if cell.name in study.same_as:  # not run: its time is the other cell's
            continue
        summary = summarise_cell(study, workdir, cell)  # summed from the metrics: survives interrupted sessions
        cell_seconds += summary.seconds if summary is not None else 0.0
    machines = list(dict.fromkeys(s["machine"] for s in sessions if s.get("machine")))
    if not machines:  # invocations from before study.json recorded their machine
        machines = [f"{this_machine()} (where this report was written: the invocations did not record theirs)"]
    dates = sorted(s["started"][:10] for s in sessions if s.get("started"))
    command = f"python -m poad_jax.study --study={shown_path(study.path)}"
    if study.name != study.path.stem and study.name.startswith(f"{study.path.stem}_seeds_"):  # a report of some seeds
        command += f" --seeds={','.join(map(str, study.seeds))}"
    cut = f", {cut_off} of them cut off (counted to their last minute)" if cut_off else ""
    when = (f"run {dates[0]}{' to ' + dates[-1] if len(set(dates)) > 1 else ''}; wall time {format_seconds(wall)} "
            f"over {len(sessions)} invocation(s){cut}, " if sessions else "no invocation recorded yet; ")
    return (f"Command `{command}` (resumable); {_commits_line(study, workdir)}; report at {repo_commit()}; "
            f"{'; '.join(machines)}; {when}"
            f"{format_seconds(cell_seconds)} in the cells' updates"
            + (f" ({reused} cells reused from sibling studies, whose time counts there)." if reused else "."))


def publish(study: Study, workdir: pathlib.Path, directory: pathlib.Path,
            report_dir: pathlib.Path | None = None) -> pathlib.Path:
    """Copies the report's figures (in `report_dir`, default `workdir`) to `directory/<study>_*.png` and
    writes the study's page, `directory/<study>.md` (`page.study_page`): the report's tables and figures
    with the study's reading (its sidecar, `studies/<study>.md`), which a re-publish reads again and so
    never loses; without a sidecar, the report alone."""
    import shutil

    report_dir = workdir if report_dir is None else report_dir
    directory.mkdir(parents=True, exist_ok=True)
    built = read_report(report_dir)
    line = provenance(study, workdir)  # before writing: the commit is not "-dirty" from this report's own files
    for figure in FIGURES:
        source = report_dir / f"{figure}.png"
        if source.exists():
            shutil.copyfile(source, directory / f"{study.name}_{figure}.png")
    built = built.renamed({f"{figure}.png": f"{study.name}_{figure}.png" for figure in FIGURES})
    path = directory / f"{study.name}.md"
    path.write_text(page.study_page(study, page.ReportBlocks.of(built, line), directory))
    return path


def shown_path(path: pathlib.Path) -> str:
    """A study's file in a report: relative to the repository when inside it (the published
    reports), else to the working directory when inside that (a user's own project), else absolute."""
    for root in (REPO, pathlib.Path.cwd()):
        try:
            return path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            continue
    return str(path)


@dataclasses.dataclass
class Report:
    """A study's report as parts, each a list of Markdown lines: `header` (base config, what "final"
    means), `groups` (the table of final values per group), `sections` (the per-cell tables and what
    follows them, each a list of lines), `figures` (the seed-band figures as (name, file), or a line
    saying none has a finished cell yet) and `closing` (figures drawn from every cell's updates, e.g. the
    per-step curves).  `markdown()` is report.md; the published page sets the same parts beside the
    study's reading (`page.study_page`)."""

    name: str
    header: list[str]
    groups: list[str]
    sections: list[list[str]]
    figures: list[tuple[str, str]]
    no_figures: str | None = None
    closing: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    def figure_lines(self) -> list[str]:
        lines = [line for name, file in self.figures for line in ("", f"![{name}]({file})")]
        return lines if self.figures or self.no_figures is None else ["", self.no_figures]

    def detail_lines(self) -> list[str]:
        """The sections, then the closing figures: everything below the group table but the seed bands."""
        return ([line for section in self.sections for line in ("", *section)]
                + [line for name, file in self.closing for line in ("", f"![{name}]({file})")])

    def markdown(self) -> str:
        lines = [f"# Study `{self.name}`", "", *self.header, "", *self.groups]
        lines += [line for section in self.sections for line in ("", *section)] + self.figure_lines()
        lines += [line for name, file in self.closing for line in ("", f"![{name}]({file})")]
        return "\n".join(lines) + "\n"

    def renamed(self, files: dict[str, str]) -> "Report":
        """The same report with its figure files renamed (`files`: old -> new), in every part."""
        def rename(text: str) -> str:
            for old, new in files.items():
                text = text.replace(f"({old})", f"({new})")
            return text
        return dataclasses.replace(
            self, sections=[[rename(line) for line in section] for section in self.sections],
            figures=[(name, files.get(file, file)) for name, file in self.figures],
            closing=[(name, files.get(file, file)) for name, file in self.closing])


REPORT_PARTS = "report_parts.json"  # the parts of report.md, beside it, for `publish`


def read_report(report_dir: pathlib.Path) -> Report:
    """The report `write_report` wrote into `report_dir`, as its parts."""
    data = read_json(report_dir / REPORT_PARTS)
    if data is None:
        raise StudyError(f"{report_dir} holds no report yet: write it first (--report)")
    return Report(**{**data, "figures": [tuple(f) for f in data["figures"]],
                     "closing": [tuple(f) for f in data["closing"]]})


def build_report(study: Study, workdir: pathlib.Path, out: pathlib.Path) -> Report:
    """Draws the figures into `out` and returns the report's parts (`Report`)."""
    results = aggregate(study, workdir)
    per_cell = cell_table(study, workdir)
    if len(per_cell) == 2:
        raise StudyError(f"no cell of study {study.name!r} in {workdir} has logged an update yet")
    options = study.report_options
    metric, fraction, threshold = options.metric, options.final_fraction, options.threshold
    reference_label, reference = options.reference.label, options.reference.values
    any_finished = any(r.curves for r in results)
    out.mkdir(parents=True, exist_ok=True)
    for figure in FIGURES:  # none left from an earlier report
        (out / f"{figure}.png").unlink(missing_ok=True)
    stepped = options.steps is not None and plot_step_curves(study, workdir, out / "steps.png")
    moved = plot_dynamics(study, workdir, out / "dynamics.png")
    if any_finished:
        plot_curves(study, results, out / "return.png", "return")
        plot_curves(study, results, out / "success.png", "success")
        if options.heatmap:
            plot_heatmap(study, results, out / "heatmap.png")
    header = ["group", "seeds", f"final {metric}", "final success"]
    discounted_column = metric != "discounted_return" and any(r.final_discounted[2] for r in results)
    if discounted_column:  # the discounted return beside another metric (as the metric, it is column 3)
        header.append("final discounted_return")
    if any(r.theory is not None for r in results):
        header.append("optimum under its discount")
    if threshold is not None:
        header.append(f"env steps to {metric} >= {threshold}")
    if reference:
        header.append(reference_label)
    groups = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in results:
        row = [r.label, str(len(r.seeds)), _fmt(*r.final_return), _fmt(*r.final_success)]
        if discounted_column:
            row.append(_fmt(*r.final_discounted))
        if "optimum under its discount" in header:
            row.append("-" if r.theory is None else f"{r.theory:.3f}")
        if threshold is not None:
            reached = [s for s in r.threshold_steps if not math.isnan(s)]
            row.append(f"{len(reached)}/{len(r.threshold_steps)} reached" +
                       (f"; mean {np.mean(reached):,.0f}" if reached else ""))
        if reference:
            low, high = reference.get(r.label, (math.nan, math.nan))
            row.append("-" if math.isnan(low) else f"{low:g}" if low == high else f"{low:g}-{high:g}")
        groups.append("| " + " | ".join(row) + " |")
    sections = [["Per cell (finished and running; the group rows above count finished cells only; time in "
                 "updates excludes start-up and compilation):", "", *per_cell]]
    for table in (pairs_table(results, options.pairs, metric), success_count_table(study, workdir),
                  final_success_count_table(study, workdir),
                  success_speed_table(study, workdir), step_outcome_table(study, workdir),
                  final_step_count_table(study, workdir)):
        if table:
            sections.append(table)
    dynamics = dynamics_table(study, workdir)
    if dynamics:
        sections.append(dynamics + (["", "![dynamics](dynamics.png)"] if moved else []))
    same = same_numbers_lines(study, workdir) + not_run_lines(study)
    if same:
        sections.append(["\n\n".join(same)])
    for section in (evaluation_section(study, workdir), actions_section(study, workdir, fraction),
                    best_programs_section(study, workdir)):
        if section:
            sections.append(section)
    figures = [("return", "return.png"), ("success", "success.png")] if any_finished else []
    if any_finished and options.heatmap:
        figures.append(("heatmap", "heatmap.png"))
    return Report(
        name=study.name,
        header=[f"Base config `{shown_path(study.base_config)}`; fixed: "
                + (", ".join(f"`{k}={v}`" for k, v in study.fixed.items()) or "none") + ".",
                f"Final = mean over the updates in the last {fraction:.0%} of env steps, then mean ± sample std "
                f"over the finished seeds."],
        groups=groups, sections=sections, figures=figures,
        no_figures=None if any_finished else
        "No cell has finished yet: the seed-band figures come with the first finished cell.",
        closing=[("steps", "steps.png")] if stepped else [])


def write_report(study: Study, workdir: pathlib.Path, out: pathlib.Path | None = None) -> pathlib.Path:
    """Writes `report.md`, `return.png`, `success.png`, `dynamics.png` when a learner logged (and
    `heatmap.png`, and `steps.png` with report option `steps`) on the cells in `workdir`, into `out`
    (default `workdir`); `report_parts.json` beside them holds the report's parts for `publish`."""
    out = workdir if out is None else out
    built = build_report(study, workdir, out)
    (out / REPORT_PARTS).write_text(json.dumps(dataclasses.asdict(built), indent=1))
    path = out / "report.md"
    path.write_text(built.markdown())
    return path
