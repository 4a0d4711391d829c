"""Where a study's numbers come from, as its page says: the command, the cells' commits, the machines, the
dates and the time (`provenance`), and a study file's path as a page shows it (`shown_path`)."""

from __future__ import annotations

import pathlib

from poad_jax.tools.study.scheduler import format_seconds, read_json, repo_commit, this_machine
from poad_jax.tools.study.spec import CELL_FILE, REPO, STUDY_FILE, Study, grid
from poad_jax.tools.study.tables import summarise_cell


def shown_path(path: pathlib.Path) -> str:
    """A study's file in a report: relative to the repository when inside it (the published
    reports), else to the working directory when inside that (a user's own project), else absolute."""
    for root in (REPO, pathlib.Path.cwd()):
        try:
            return path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            continue
    return str(path)


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
