"""A study's report: its parts (`Report`) built from the tables (`tables`) and figures (`figures`),
written beside the cells (`write_report`) and published as the study's page (`publish`, with `page`
and the provenance line of `provenance`)."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil

from poad_jax.tools.study import page
from poad_jax.tools.study.actions import actions_section
from poad_jax.tools.study.evaluations import evaluation_section
from poad_jax.tools.study.figures import plot_curves, plot_dynamics, plot_heatmap, plot_step_curves
from poad_jax.tools.study.programs import best_programs_section
from poad_jax.tools.study.provenance import provenance, shown_path
from poad_jax.tools.study.scheduler import read_json
from poad_jax.tools.study.spec import Study, StudyError
from poad_jax.tools.study.speed import success_speed_table
from poad_jax.tools.study.tables import (aggregate, cell_table, dynamics_table, final_step_count_table,
                                         final_success_count_table, groups_table, not_run_lines, pairs_table,
                                         same_numbers_lines, step_outcome_table, success_count_table)

# The report's numbers and tables as they were importable from here before they had modules of their own.
from poad_jax.tools.study.speed import wilson_interval  # noqa: E402,F401
from poad_jax.tools.study.statistics import (PHASE_SECONDS, episode_successes, final_value,  # noqa: E402,F401
                                             learning_numbers, step_outcomes, step_successes, steps_to_threshold,
                                             training_dynamics, welch_test)
from poad_jax.tools.study.tables import GroupResult  # noqa: E402,F401


FIGURES = ("return", "success", "heatmap", "steps", "dynamics")


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
    metric, fraction = options.metric, options.final_fraction
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
    groups = groups_table(results, options)
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


def publish(study: Study, workdir: pathlib.Path, directory: pathlib.Path,
            report_dir: pathlib.Path | None = None) -> pathlib.Path:
    """Copies the report's figures (in `report_dir`, default `workdir`) to `directory/<study>_*.png` and
    writes the study's page, `directory/<study>.md` (`page.study_page`): the report's tables and figures
    with the study's reading (its sidecar, `studies/<study>.md`), which a re-publish reads again and so
    never loses; without a sidecar, the report alone."""
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
