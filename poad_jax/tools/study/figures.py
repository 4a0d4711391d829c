"""A study's figures: learning curves with seed bands, the heatmap over two axes, the
per-env-step curves of studies whose steps succeed or fail (DataSciCoding's programs), and how the
policy moved (the learner's KL, entropies, explained variance and behaviour gap)."""

from __future__ import annotations

import math
import pathlib
import textwrap
import warnings
from typing import Any

import numpy as np

from poad_jax.tools.study.scheduler import read_records
from poad_jax.tools.study.spec import StepNames, Study, grid, log_dir, value_label
from poad_jax.tools.study.statistics import smooth


STEP_PANELS = ("share", "cut_off", "mean", "best", "approx_kl", "entropy")


def step_curves(records: list[dict[str, Any]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per update u, at env step s_u (s_0 = 0), what a DataSciCoding user watches:

        share_u = k_u / (s_u - s_{u-1})      (k_u = steps_succeeded_u: the programs that ran)
        cut_off_u = c_u / (s_u - s_{u-1})    (c_u = actions_cut_off_u: actions the token limit ended)
        mean_u  = success_reward_mean_u      (their mean AUC; NaN when none ran)
        best_u  = best_step_reward_u         (the best AUC so far, a running max the trainer keeps)
        approx_kl_u, entropy_u               (as the learner logs them)

    Missing values are NaN, so a curve shows gaps rather than zeros."""
    def value(record: dict[str, Any], key: str) -> float:
        x = record.get(key)
        return float("nan") if x is None else float(x)

    steps = np.array([float(r.get("env_steps") or 0) for r in records])
    taken = np.diff(np.concatenate([[0.0], steps]))
    counts = np.array([float(r.get("steps_succeeded") or 0) for r in records])
    cut = np.array([value(r, "actions_cut_off") for r in records])
    per_step = np.where(taken > 0, taken, 1.0)
    share, cut_off = (np.where(taken > 0, x / per_step, np.nan) for x in (counts, cut))
    named = {"mean": "success_reward_mean", "best": "best_step_reward", "approx_kl": "approx_kl", "entropy": "entropy"}
    curves = {"share": (steps, share), "cut_off": (steps, cut_off)}
    curves.update({panel: (steps, np.array([value(r, key) for r in records])) for panel, key in named.items()})
    return curves


def logged_panels(cells: list[dict[str, tuple[np.ndarray, np.ndarray]]]) -> list[str]:
    """The `STEP_PANELS` some cell's `step_curves` has a value for: runs that do not log one (cut-off
    actions, before that metric existed) leave its panel out rather than draw an empty one."""
    return [panel for panel in STEP_PANELS if any(np.any(~np.isnan(c[panel][1])) for c in cells)]


def plot_step_curves(study: Study, workdir: pathlib.Path, path: pathlib.Path) -> bool:
    """One figure of the `STEP_PANELS` the cells logged (`logged_panels`) per env step (report option
    `steps`), one line per group with its mean ± std band over the cells that have logged (running ones
    too); False when none has."""
    names = study.report_options.steps or StepNames()
    succeeded, reward = names.succeeded, names.reward
    titles = {"share": f"share of steps {succeeded}", "cut_off": "share of actions cut off by the token limit",
              "mean": f"mean {reward} of {succeeded} steps",
              "best": f"best {reward} so far", "approx_kl": "approx KL per update",
              "entropy": "entropy per token"}
    groups = _group_curves(study, workdir, step_curves)
    panels = logged_panels([c for cells in groups.values() for c in cells])
    if not panels:
        return False
    window = study.report_options.smoothing
    _plot_panels(groups, [(panel, titles[panel]) for panel in panels], path,
                 windows={panel: 1 if panel == "best" else window for panel in panels},
                 title=f"{study.name}: mean ± std over the cells that have logged"
                       + (f", moving average of {window} updates (best: none)" if window > 1 else ""))
    return True


# (record key, panel title): what the learner logs of how the policy moved, update by update.
DYNAMICS_PANELS = (
    ("approx_kl", "approx KL of π per update"),
    ("entropy_vocabulary", "entropy per token, over the vocabulary"),
    ("entropy_offered", "entropy over the offered continuations"),
    ("explained_variance", "critic's explained variance"),
    ("behaviour_kl_action", "KL(μ ‖ π_old) per action"),
    ("importance_weight", "mean truncated weight min(1, π_old / μ)"),
)


def dynamics_curves(records: list[dict[str, Any]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per update u, at env step s_u, each `DYNAMICS_PANELS` key k as the learner logged it: (s, k_u),
    NaN where an update did not log k (so a curve shows a gap, not a zero)."""
    steps = np.array([float(r.get("env_steps") or 0) for r in records])
    return {key: (steps, np.array([float("nan") if r.get(key) is None else float(r[key]) for r in records]))
            for key, _ in DYNAMICS_PANELS}


def plot_dynamics(study: Study, workdir: pathlib.Path, path: pathlib.Path) -> bool:
    """One figure of the `DYNAMICS_PANELS` some cell logged, per env step, one line per group with its
    mean ± std band over the cells that have logged (running ones too; the report's smoothing); False
    when no cell has logged any (no learner ran)."""
    groups = _group_curves(study, workdir, dynamics_curves)
    cells = [c for group in groups.values() for c in group]
    panels = [(key, title) for key, title in DYNAMICS_PANELS if any(np.any(~np.isnan(c[key][1])) for c in cells)]
    if not panels:
        return False
    window = study.report_options.smoothing
    _plot_panels(groups, panels, path, windows={key: window for key, _ in panels}, log_panels=("approx_kl",),
                 title=f"{study.name}: how the policy moved, mean ± std over the cells that have logged"
                       + (f", moving average of {window} updates" if window > 1 else ""))
    return True


def _group_curves(study: Study, workdir: pathlib.Path, curves_of) -> dict[tuple, list[dict]]:
    """{group: [curves_of(records) per cell that has logged]}, in the study's grid order."""
    groups: dict[tuple, list[dict]] = {}
    for cell in grid(study):
        records = read_records(log_dir(study, workdir, cell.name))
        if records:
            groups.setdefault(cell.group, []).append(curves_of(records))
    return groups


def _plot_panels(groups: dict[tuple, list[dict]], panels: list[tuple[str, str]], path: pathlib.Path,
                 windows: dict[str, int], title: str, log_panels: tuple[str, ...] = ("approx_kl",)) -> None:
    """A row (three per row beyond three) of panels, one per (key, title), each with a line per group:
    the mean ± std band (`band`) of its cells' curves[key], smoothed over windows[key] updates; a
    panel in `log_panels` with a value above 0 gets a log axis and the band of log10 x instead
    (geometric mean x std^+-1; values <= 0 left out), which a log axis can show whole."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = len(panels) if len(panels) <= 3 else 3
    rows = math.ceil(len(panels) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 3.2 * rows), squeeze=False)
    flat = [axis for row in axes for axis in row]
    positive = {key for key, _ in panels if key in log_panels
                and any(np.any(c[key][1] > 0) for cells in groups.values() for c in cells)}
    for index, (group, cells) in enumerate(groups.items()):
        label = f"{', '.join(l for _, l in group)} (n={len(cells)})"
        for axis, (key, _) in zip(flat, panels):
            if key in positive:
                steps, low, middle, high = geometric_band([c[key] for c in cells], windows[key])
            else:
                steps, middle, std = band([c[key] for c in cells], windows[key])
                low, high = middle - std, middle + std
            axis.plot(steps, middle, color=f"C{index % 10}", label=label, linewidth=1.5)
            axis.fill_between(steps, low, high, color=f"C{index % 10}", alpha=0.18, linewidth=0)
    for axis, (key, panel_title) in zip(flat, panels):
        axis.set_title(panel_title + (" (geometric)" if key in positive else ""), fontsize=10)
        axis.set_xlabel("env steps")
        axis.grid(alpha=0.3)
        if key in log_panels and key in positive:
            axis.set_yscale("log")
    for axis in flat[len(panels):]:
        axis.axis("off")
    handles, labels = flat[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(len(labels), 4),
                  fontsize=8, frameon=False)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout(rect=(0, 0, 1, 0.93))
    figure.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(figure)


def band(curves: list[tuple[np.ndarray, np.ndarray]], window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and std over seeds of the smoothed curves, on the first seed's env-step grid
    (others interpolated onto it)."""
    grid_steps = max((c[0] for c in curves), key=len)
    stacked = []
    for steps, values in curves:
        smoothed = smooth(values, window)
        valid = ~np.isnan(smoothed)
        if valid.sum() == 0:
            continue
        stacked.append(np.interp(grid_steps, steps[valid], smoothed[valid], left=np.nan, right=np.nan))
    if not stacked:  # no seed has a value yet (e.g. no episode has ended): an empty curve, not a crash
        empty = np.full(len(grid_steps), np.nan)
        return grid_steps, empty, empty
    stacked = np.array(stacked)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns before a seed's first episode
        return grid_steps, np.nanmean(stacked, axis=0), np.nanstd(stacked, axis=0)


def geometric_band(curves: list[tuple[np.ndarray, np.ndarray]],
                   window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`band` of log10 x, back on x's scale: (steps, 10^(m - s), 10^m, 10^(m + s)) with m and s the mean
    and std over seeds of the smoothed log10 x_u; values x_u <= 0 count as missing (`band` bridges gaps).
    A band that a log axis shows whole (mean - std of x itself can fall below 0)."""
    logs = [(steps, np.log10(np.where(values > 0, values, np.nan))) for steps, values in curves]
    steps, mean, std = band(logs, window)
    return steps, 10 ** (mean - std), 10 ** mean, 10 ** (mean + std)


def plot_curves(study: Study, results: list[Any], path: pathlib.Path, which: str = "return") -> None:
    """Return (or success) per env step, one line per group of `results` (`report.GroupResult`) with its
    mean ± std band over seeds, a panel per value of report option `facet`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    options = study.report_options
    window, facet = options.smoothing, options.facet
    reference_label, reference = options.reference.label, options.reference.values
    facet_values = []
    for result in results:
        key = dict(result.group).get(facet) if facet else None
        if key not in facet_values:
            facet_values.append(key)
    columns = min(len(facet_values), 4)
    rows = math.ceil(len(facet_values) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(max(4.2 * columns, 6.4), 3.2 * rows), squeeze=False, sharey=True)
    colours = {}
    for index, key in enumerate(facet_values):
        axis = axes[index // columns][index % columns]
        for result in results:
            if facet and dict(result.group).get(facet) != key:
                continue
            curves = result.curves if which == "return" else result.success_curves
            if not curves:
                continue
            label = ", ".join(l for a, l in result.group if a != facet)
            colour = colours.setdefault(label, f"C{len(colours) % 10}")
            steps, mean, std = band(curves, window)
            axis.plot(steps, mean, color=colour, label=f"{label} (n={len(curves)})", linewidth=1.5)
            axis.fill_between(steps, mean - std, mean + std, color=colour, alpha=0.18, linewidth=0)
            if which == "return" and result.theory is not None:
                axis.axhline(result.theory, color=colour, linestyle=":", linewidth=1)
            if which == "return" and result.label in reference:
                low, high = reference[result.label]
                axis.axhspan(low, high, color=colour, alpha=0.08, linewidth=0)
                for level in {low, high}:
                    axis.axhline(level, color=colour, linestyle="--", linewidth=0.8)
        axis.set_title(key if key else study.name, fontsize=10)
        axis.set_xlabel("env steps")
        axis.grid(alpha=0.3)
    for index in range(len(facet_values), rows * columns):
        axes[index // columns][index % columns].axis("off")
    axes[0][0].set_ylabel(options.metric if which == "return" else "success rate")
    seen = {}  # one legend entry per group, across facets
    for row in axes:
        for axis in row:
            for handle, label in zip(*axis.get_legend_handles_labels()):
                seen.setdefault(label, handle)
    columns_fit = max(1, int(figure.get_figwidth() * 12 / max(len(label) + 6 for label in seen)))  # ~12 chars/inch
    legend_columns = max(1, min(len(seen), 4, columns_fit))
    # Below the axes, outside the figure: the saved image grows to hold it (bbox_inches="tight").
    figure.legend(list(seen.values()), list(seen.keys()), loc="upper center", bbox_to_anchor=(0.5, 0.0),
                  ncol=legend_columns, fontsize=8, frameon=False)
    subtitle = f"mean ± std over seeds, moving average of {window} updates" if window > 1 else "mean ± std over seeds"
    if which == "return" and any(r.theory is not None for r in results):
        subtitle += "; dotted: optimum under the method's discount"
    if which == "return" and any(r.label in reference for r in results):
        subtitle += f"; dashed: {reference_label}"
    title_width = max(40, int(figure.get_figwidth() * 11))  # characters of a 10-point line across the figure
    figure.suptitle(textwrap.fill(f"{study.name}: {subtitle}", width=title_width), fontsize=10)  # never clipped
    figure.tight_layout(rect=(0, 0, 1, 0.95))
    figure.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(figure)


def plot_heatmap(study: Study, results: list[Any], path: pathlib.Path) -> None:
    """Final return over two axes (`report.heatmap = (row_axis, column_axis)`), beside the theory's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    row_axis, column_axis = study.report_options.heatmap
    row_labels = [value_label(row_axis, v) for v in study.axes[row_axis]]
    column_labels = [value_label(column_axis, v) for v in study.axes[column_axis]]
    measured = np.full((len(row_labels), len(column_labels)), np.nan)
    predicted = np.full_like(measured, np.nan)
    for result in results:
        labels = dict(result.group)
        i, j = row_labels.index(labels[row_axis]), column_labels.index(labels[column_axis])
        measured[i, j] = result.final_return[0]
        predicted[i, j] = np.nan if result.theory is None else result.theory
    panels = [("measured final return (mean over seeds)", measured)]
    if not np.isnan(predicted).all():
        panels.append(("optimum under the method's discount", predicted))
    figure, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels) + 1.6, 0.5 * len(row_labels) + 2.2),
                                squeeze=False)
    short = [label.split("=", 1)[-1] for label in column_labels]  # "action_length=8" -> "8"
    finite = np.concatenate([p[~np.isnan(p)] for _, p in panels])
    low, high = (float(finite.min()), float(finite.max())) if len(finite) else (0.0, 1.0)
    for index, (axis, (title, table)) in enumerate(zip(axes[0], panels)):
        image = axis.imshow(table, cmap="viridis", vmin=low, vmax=high, aspect="auto")
        axis.set_xticks(range(len(short)), short, fontsize=8)
        axis.set_xlabel(column_axis.split(".")[-1], fontsize=9)
        axis.set_yticks(range(len(row_labels)), row_labels if index == 0 else [], fontsize=8)
        for i in range(table.shape[0]):
            for j in range(table.shape[1]):
                if not np.isnan(table[i, j]):
                    axis.text(j, i, f"{table[i, j]:.2f}", ha="center", va="center", fontsize=8,
                              color="white" if table[i, j] < (low + high) / 2 else "black")
        axis.set_title(title, fontsize=9)
    figure.colorbar(image, ax=axes[0].tolist(), shrink=0.8)
    figure.suptitle(study.name, fontsize=10)
    figure.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(figure)
