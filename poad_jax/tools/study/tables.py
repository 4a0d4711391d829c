"""A study's report as Markdown tables over its cells: the final values per group (`aggregate`,
`groups_table`), pairs of groups, each cell's progress, pooled successes, succeeded steps, PPO's dynamics,
and the lines naming cells with the same numbers or not run.  The numbers are `statistics`'."""

from __future__ import annotations

import dataclasses
import importlib
import math
import pathlib

import numpy as np

from poad_jax.tools.study.scheduler import cell_finished, format_seconds, read_records, seed_major
from poad_jax.tools.study.spec import Cell, ReportOptions, Study, cell_config, grid, log_dir
from poad_jax.tools.study.speed import steps_to_first_success, wilson_interval
from poad_jax.tools.study.statistics import (PHASE_SECONDS, curve, episode_successes, final_value, learning_numbers,
                                             mean_std, step_outcomes, step_successes, steps_to_threshold,
                                             training_dynamics, welch_test)


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


def groups_table(results: list[GroupResult], options: ReportOptions) -> list[str]:
    """Markdown lines: the table of final values per group (`aggregate`'s results), mean ± sample std over
    the finished seeds, with the columns the report options ask for (the discounted return beside another
    metric, the optimum under the group's discount, the env steps to `threshold`, published values)."""
    metric, threshold = options.metric, options.threshold
    reference_label, reference = options.reference.label, options.reference.values
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
    return groups


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
