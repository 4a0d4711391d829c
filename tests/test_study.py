"""The study runner as a user runs it (`python -m poad_jax.study`), on the toy task.

- A 2 x 2 grid (method x seed) runs every cell as a trainer run directory,
  two at a time, and writes the report.
- Re-running the same command skips finished cells (nothing rewritten).
- A sibling study reuses finished cells whose trainer config is the same.
- `kill -9` of the runner kills its trainers too; re-running resumes the
  killed cell from its checkpoint and finishes it with each update logged once.
- The report's table equals a hand computation from the cells' metrics.jsonl.
- Mistakes are one line and exit status 2.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from poad_jax.run import action_log
from poad_jax.run import config as config_lib
from poad_jax.run import hardware
from poad_jax.tools.study import figures, page, report, scheduler, spec, tables

# One xdist worker runs every test of this module (`--dist loadgroup`, scripts/test.sh): its module
# fixture, minutes of training or of subprocesses, is then set up once per suite, not once per worker.
pytestmark = pytest.mark.xdist_group("study")

REPO = pathlib.Path(__file__).resolve().parents[1]


def write_study(directory: pathlib.Path, name: str = "toy_grid", updates: int = 2, methods=("poad", "ntpo"),
                seeds=(0, 1), extra_axes: str = "", base: str = "configs/toy.py",
                extra_report: str = "", extra: str = "") -> pathlib.Path:
    """A study file over configs/toy.py: `updates` PPO updates of 16 env steps per cell."""
    variants = ", ".join(f'{{"label": "{m.upper()}", "method": "{m}"}}' for m in methods)
    path = directory / f"{name}.py"
    path.write_text(f'''
def get_study():
    return {{
        "name": "{name}",
        "base_config": "{REPO / base}",
        "fixed": {{"total_env_steps": {16 * updates}, "tensorboard": False, "plot": False}},
        "axes": {{"variant": [{variants}]{extra_axes}}},
        "seeds": {tuple(seeds)!r},{extra}
        "report": {{"metric": "episode_return", "threshold": 0.5, "smoothing": 1{extra_report}}},
    }}
''')
    return path


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "poad_jax.study", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def finished_grid(tmp_path_factory):
    directory = tmp_path_factory.mktemp("study")
    study_file = write_study(directory)
    workdir = directory / "runs" / "toy_grid"
    result = run_cli(f"--study={study_file}", f"--workdir={workdir}", "--workers=2")
    assert result.returncode == 0, result.stderr[-2000:]
    return study_file, workdir, result


def test_a_two_by_two_grid_runs_every_cell_and_reports(finished_grid):
    _, workdir, result = finished_grid
    cells = sorted(p.name for p in (workdir / "cells").iterdir())
    assert cells == ["NTPO__seed=0", "NTPO__seed=1", "POAD__seed=0", "POAD__seed=1"]
    for cell in cells:
        cell_dir = workdir / "cells" / cell
        records = [json.loads(line) for line in (cell_dir / "metrics.jsonl").read_text().splitlines()]
        assert [r["update"] for r in records] == [1, 2] and records[-1]["env_steps"] == 32
        config = json.loads((cell_dir / "config.json").read_text())
        assert config["method"] == cell.split("__")[0].lower()
        assert config["seed"] == int(cell.split("=")[-1])
        assert json.loads((cell_dir / "cell.json").read_text())["status"] == "done"
    assert "4 done, 0 running, 0 left of 4" in result.stdout
    for name in ("report.md", "return.png", "success.png"):
        assert (workdir / name).stat().st_size > 0


def hand_final(path: pathlib.Path, metric: str) -> float:
    """Mean of `metric` over the records in the last 10 % of env steps (written out plainly)."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    last = records[-1]["env_steps"]
    values = [r[metric] for r in records if r["env_steps"] > 0.9 * last and r[metric] is not None]
    return sum(values) / len(values)


def test_report_numbers_equal_a_hand_computation(finished_grid):
    _, workdir, _ = finished_grid
    table = {}
    for line in (workdir / "report.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) >= 4 and cells[0] in ("POAD", "NTPO"):
            table.setdefault(cells[0], cells)  # the first table's rows (the success counts come later)
    assert set(table) == {"POAD", "NTPO"}
    for group, row in table.items():
        for column, metric in ((2, "episode_return"), (3, "success_rate")):
            finals = [hand_final(workdir / "cells" / f"{group}__seed={s}" / "metrics.jsonl", metric) for s in (0, 1)]
            mean = sum(finals) / 2
            std = (sum((f - mean) ** 2 for f in finals) / (2 - 1)) ** 0.5
            assert row[column] == f"{mean:.3f} ± {std:.3f}"
        assert row[1] == "2"


def test_rerunning_skips_finished_cells(finished_grid):
    study_file, workdir, _ = finished_grid
    before = {p: p.stat().st_mtime_ns for p in (workdir / "cells").glob("*/metrics.jsonl")}
    result = run_cli(f"--study={study_file}", f"--workdir={workdir}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "4 done, 0 running, 0 left of 4" in result.stdout.splitlines()[0]
    assert {p: p.stat().st_mtime_ns for p in before} == before


def trainer_pids(cell_dir: pathlib.Path) -> list[int]:
    """PIDs of live processes whose command line names `cell_dir`."""
    pids = []
    for proc in pathlib.Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = (proc / "stat").read_text().split()[2]
            except OSError:
                continue
            if f"--workdir={cell_dir}" in cmdline and state != "Z":
                pids.append(int(proc.name))
    return pids


def test_kill_9_of_the_runner_kills_its_trainer_and_a_rerun_resumes(tmp_path):
    study_file = write_study(tmp_path, name="killed", updates=6, methods=("poad",), seeds=(0,))
    workdir = tmp_path / "runs" / "killed"
    cell_dir = workdir / "cells" / "POAD__seed=0"
    runner = subprocess.Popen([sys.executable, "-m", "poad_jax.study", f"--study={study_file}",
                               f"--workdir={workdir}"], cwd=REPO, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # wait for the second update's checkpoint
        steps = sorted((cell_dir / "checkpoints").glob("[0-9]*")) if (cell_dir / "checkpoints").exists() else []
        if len(steps) >= 1 and any(p.name == "2" for p in steps):
            break
        assert runner.poll() is None, "the runner ended before it could be killed"
        time.sleep(0.1)
    else:
        pytest.fail("no checkpoint within 300 s")
    assert trainer_pids(cell_dir), "the trainer should be running"
    os.kill(runner.pid, signal.SIGKILL)
    runner.wait()
    for _ in range(100):  # the trainer gets SIGKILL from the kernel when its parent dies
        if not trainer_pids(cell_dir):
            break
        time.sleep(0.1)
    assert trainer_pids(cell_dir) == []
    assert json.loads((cell_dir / "cell.json").read_text())["status"] == "running"
    sessions = json.loads((workdir / "study.json").read_text())["sessions"]
    assert len(sessions) == 1 and sessions[0]["ended"] is False  # the killed invocation is on record

    result = run_cli(f"--study={study_file}", f"--workdir={workdir}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "resuming" in (cell_dir / "train.log").read_text()
    records = [json.loads(line) for line in (cell_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in records] == [1, 2, 3, 4, 5, 6]
    cell = json.loads((cell_dir / "cell.json").read_text())
    assert cell["status"] == "done"
    assert cell["commits"] == [scheduler.repo_commit()]  # both launches at this checkout's commit, listed once
    sessions = json.loads((workdir / "study.json").read_text())["sessions"]
    assert [s["ended"] for s in sessions] == [False, True] and all(s["cells_run"] == 1 for s in sessions)


def one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_a_report_of_some_seeds_goes_beside_the_whole_one(finished_grid, tmp_path):
    """`--report --seeds=1` writes a report of seed 1's cells alone into <workdir>/<study>_seeds_1/ and
    publishes it under that name; the whole report stays as it was; an unknown seed is one line."""
    study_file, workdir, _ = finished_grid
    whole = (workdir / "report.md").read_text()
    done = run_cli(f"--study={study_file}", f"--workdir={workdir}", "--report", "--seeds=1",
                   f"--publish={tmp_path / 'published'}")
    assert done.returncode == 0, done.stderr[-2000:]
    part = (workdir / "toy_grid_seeds_1" / "report.md").read_text()
    assert (workdir / "report.md").read_text() == whole
    assert part.startswith("# Study `toy_grid_seeds_1`") and "(return.png)" in part
    assert "| POAD__seed=1 |" in part and "| NTPO__seed=1 |" in part and "__seed=0 |" not in part
    assert "| POAD | 1 |" in part and "| POAD | 2 |" in whole  # one seed per group against two
    published = (tmp_path / "published" / "toy_grid_seeds_1.md").read_text()
    assert "(toy_grid_seeds_1_return.png)" in published
    assert (tmp_path / "published" / "toy_grid_seeds_1_return.png").exists()
    one_line_error(run_cli(f"--study={study_file}", f"--workdir={workdir}", "--report", "--seeds=7"),
                   "--seeds 7: study 'toy_grid' has seeds 0,1")


@pytest.mark.long
def test_one_line_errors(tmp_path, finished_grid):
    one_line_error(run_cli(f"--study={tmp_path / 'missing.py'}"), "no study file")
    broken = tmp_path / "broken.py"
    broken.write_text("def get_study(:\n")
    one_line_error(run_cli(f"--study={broken}"), "cannot load study file", "SyntaxError")
    typo = write_study(tmp_path, name="typo", extra_axes=', "ppo.actor_lrr": [1e-3]')
    one_line_error(run_cli(f"--study={typo}", f"--workdir={tmp_path / 'w'}"), "ppo.actor_lrr",
                   "did you mean 'ppo.actor_lr'")
    bad_value = write_study(tmp_path, name="bad_value", methods=("ppo",))
    one_line_error(run_cli(f"--study={bad_value}", f"--workdir={tmp_path / 'w'}"), "unknown method 'ppo'")
    other = write_study(tmp_path, name="other_study")
    _, workdir, _ = finished_grid
    one_line_error(run_cli(f"--study={other}", f"--workdir={workdir}"), "holds study 'toy_grid'")
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    one_line_error(run_cli(f"--study={other}", f"--workdir={a_file}"), "is a file")
    one_line_error(run_cli(f"--study={other}", f"--workdir={tmp_path / 'never'}", "--report"), "holds no study")
    one_line_error(run_cli(f"--study={other}", f"--workdir={workdir}", "--report", "--up-to=8"),
                   "--up-to chooses how far to run; --report runs nothing")
    assert not (tmp_path / "w").exists() or not any((tmp_path / "w").iterdir())


def test_changed_cell_settings_are_refused_but_more_env_steps_resume(tmp_path):
    study = spec.load_study(write_study(tmp_path, name="s", updates=1, methods=("poad",), seeds=(0,)))
    cells = spec.grid(study)
    workdir = tmp_path / "w"
    scheduler.prepare_workdir(study, workdir, cells)
    cell_dir = workdir / "cells" / cells[0].name
    cell_dir.mkdir(parents=True)
    scheduler.write_json_atomic(cell_dir / "cell.json", {"overrides": {**cells[0].overrides, "ppo.gamma": 0.5}})
    with pytest.raises(spec.StudyError, match="ppo.gamma"):
        scheduler.prepare_workdir(study, workdir, cells)
    scheduler.write_json_atomic(cell_dir / "cell.json", {"overrides": {**cells[0].overrides, "total_env_steps": 8}})
    scheduler.prepare_workdir(study, workdir, cells)  # total_env_steps may grow: the trainer continues


def test_smoothing_band_and_final_value_are_plain_formulas():
    values = np.array([1.0, np.nan, 3.0, 5.0])
    np.testing.assert_allclose(figures.smooth(values, 2), [1.0, 1.0, 3.0, 4.0])
    records = [{"env_steps": 10 * (i + 1), "r": v} for i, v in enumerate([0.0, 1.0, None, 2.0, 4.0])]
    assert report.final_value(records, "r", fraction=0.3) == pytest.approx(3.0)  # steps 40, 50
    assert report.steps_to_threshold(records, "r", 1.5, window=1) == 40
    steps, mean, std = figures.band([(np.array([0.0, 1.0]), np.array([1.0, 3.0])),
                                       (np.array([0.0, 1.0]), np.array([3.0, 5.0]))], window=1)
    np.testing.assert_allclose(mean, [2.0, 4.0])
    np.testing.assert_allclose(std, [1.0, 1.0])


def test_a_sibling_study_reuses_finished_cells_with_the_same_trainer_config(finished_grid):
    _, workdir, _ = finished_grid
    # The same runs spelt differently (ppo.gamma named at its toy value): the trainer configs are equal.
    sibling = write_study(workdir.parent.parent, name="sibling", extra_axes=', "ppo.gamma": [0.95]')
    result = run_cli(f"--study={sibling}", f"--workdir={workdir.parent / 'sibling'}")
    assert result.returncode == 0, result.stderr[-2000:]
    cells = sorted((workdir.parent / "sibling" / "cells").iterdir())
    assert len(cells) == 4 and all(c.is_symlink() for c in cells)
    assert {c.resolve().parent.parent for c in cells} == {workdir.resolve()}
    assert result.stdout.count("reused ") == 4
    different = write_study(workdir.parent.parent, name="different", methods=("poad",), seeds=(0,),
                            extra_axes=', "ppo.gamma": [0.9]')
    study = spec.load_study(different)
    config = spec.cell_config(study, spec.grid(study)[0])
    assert scheduler.find_reusable(workdir.parent / "different", config, 32) is None


def test_cells_train_seed_major_so_an_interrupted_study_covers_every_configuration(tmp_path):
    study = spec.load_study(write_study(tmp_path, methods=("poad", "ntpo", "twosome"), seeds=(3, 1, 2)))
    order = [(cell.group[0][1], cell.seed) for cell in scheduler.seed_major(spec.grid(study), study.seeds)]
    assert order == [(m, s) for s in (3, 1, 2) for m in ("POAD", "NTPO", "TWOSOME")]


def test_a_group_without_any_ended_episode_plots_an_empty_curve_rather_than_failing():
    no_episode_yet = np.array([np.nan, np.nan, np.nan, np.nan])
    steps, mean, std = figures.band([(np.array([32.0, 64.0, 96.0, 128.0]), no_episode_yet)] * 2, window=2)
    np.testing.assert_array_equal(steps, [32.0, 64.0, 96.0, 128.0])
    assert mean.shape == std.shape == (4,) and np.isnan(mean).all() and np.isnan(std).all()


def test_a_study_workdir_is_recognised_from_another_checkout_but_not_as_another_study(tmp_path):
    study = spec.load_study(write_study(tmp_path))
    assert study.identity()["base_config"] == "configs/toy.py"  # relative: a moved clone still matches
    elsewhere = {"identity": {"name": study.name, "base_config": "/old/clone/configs/toy.py"}}
    assert study.recorded_in(elsewhere) and study.recorded_in({"identity": study.identity()})
    assert not study.recorded_in({"identity": {"name": "other", "base_config": "configs/toy.py"}})
    assert not study.recorded_in({"identity": {"name": study.name, "base_config": "/old/clone/configs/synthetic.py"}})
    assert not study.recorded_in({"identity": {"name": study.name, "base_config": "/old/clone/xconfigs/toy.py"}})
    assert not study.recorded_in(None)


def _fake_cell(workdir: pathlib.Path, name: str, records: list[dict], status: str) -> None:
    cell_dir = workdir / "cells" / name
    cell_dir.mkdir(parents=True)
    (cell_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (cell_dir / "cell.json").write_text(json.dumps({"status": status}))


def test_the_report_counts_finished_cells_and_lists_running_ones_with_their_time(tmp_path):
    """Group rows use finished cells only; the per-cell table shows every cell with its first success
    and the summed per-update seconds (a cell resumed across sessions keeps all its time)."""
    study = spec.load_study(write_study(tmp_path, updates=4, seeds=(0,)))  # 64 env steps per cell
    workdir = tmp_path / "runs"
    rng = np.random.default_rng(0)

    def records(updates, succeed_from):
        out = []
        for u in range(1, updates + 1):
            out.append({"update": u, "env_steps": 16 * u, "episodes": 2 * u,
                        "episode_return": float(rng.uniform()), "success_rate": 0.5 if u >= succeed_from else 0.0,
                        **{key: float(rng.uniform(1, 10)) for key in report.PHASE_SECONDS}})
        return out

    poad, ntpo = records(4, succeed_from=3), records(2, succeed_from=2)
    _fake_cell(workdir, "POAD__seed=0", poad, "done")
    _fake_cell(workdir, "NTPO__seed=0", ntpo, "running")  # interrupted at 32 of 64 env steps
    report.write_report(study, workdir)
    text = (workdir / "report.md").read_text()
    rows = {}
    for c in ([x.strip() for x in line.strip("|").split("|")] for line in text.splitlines()):
        if c and c[0] in ("POAD", "NTPO", "POAD__seed=0", "NTPO__seed=0"):
            rows.setdefault(c[0], c)  # each name's first table (the success counts come later)
    assert rows["POAD"][1] == "1" and rows["NTPO"][1] == "0" and rows["NTPO"][2] == "-"
    assert rows["POAD__seed=0"][1] == "done" and rows["NTPO__seed=0"][1] == "running (32 of 64)"
    assert rows["POAD__seed=0"][4] == "48" and rows["NTPO__seed=0"][4] == "32"  # first update with a success
    for name, recs in (("POAD__seed=0", poad), ("NTPO__seed=0", ntpo)):
        total = sum(r[key] for r in recs for key in report.PHASE_SECONDS)
        assert rows[name][7] == scheduler.format_seconds(total)
        assert rows[name][3] == str(recs[-1]["episodes"])


def test_a_report_before_any_cell_finishes_has_its_tables_and_no_figures(tmp_path):
    """With every cell still running the report is written (tables, no seed bands), says so, links no
    figure and leaves none from an earlier report behind; a finished cell brings the figures back."""
    study = spec.load_study(write_study(tmp_path, updates=2, seeds=(0,)))
    workdir = tmp_path / "runs"
    record = {"update": 1, "env_steps": 16, "episodes": 1, "episode_return": 0.5, "success_rate": 1.0}
    _fake_cell(workdir, "POAD__seed=0", [record], "running")
    (workdir / "return.png").write_bytes(b"stale")
    report.write_report(study, workdir)
    text = (workdir / "report.md").read_text()
    assert "| POAD__seed=0 | running (16 of 32) |" in text
    assert "No cell has finished yet" in text and ".png" not in text
    assert not (workdir / "return.png").exists() and not (workdir / "success.png").exists()
    (workdir / "cells" / "POAD__seed=0" / "metrics.jsonl").write_text(
        "".join(json.dumps({**record, "update": u, "env_steps": 16 * u}) + "\n" for u in (1, 2)))
    (workdir / "cells" / "POAD__seed=0" / "cell.json").write_text(json.dumps({"status": "done"}))
    report.write_report(study, workdir)
    assert "![return](return.png)" in (workdir / "report.md").read_text()
    assert (workdir / "return.png").stat().st_size > 1000 and (workdir / "success.png").exists()


def test_publish_takes_the_commit_before_writing_its_own_files(tmp_path, monkeypatch):
    """Publishing into a checkout must not record it as `-dirty` because of the files it is publishing:
    the provenance line is taken before the first figure or page is written."""
    study = spec.load_study(write_study(tmp_path, updates=1, seeds=(0,)))
    workdir, published = tmp_path / "runs", tmp_path / "published"
    record = {"update": 1, "env_steps": 16, "episodes": 1, "episode_return": 0.5, "success_rate": 1.0}
    _fake_cell(workdir, "POAD__seed=0", [record], "done")
    report.write_report(study, workdir)
    seen = []
    monkeypatch.setattr(report, "provenance",
                        lambda study, workdir: seen.append(sorted(p.name for p in published.iterdir())) or "LINE")
    path = report.publish(study, workdir, published)
    assert seen == [[]]
    assert "\nLINE\n" in path.read_text() and (published / f"{study.name}_return.png").exists()


SIDECAR = """<!-- the reading of toy_grid -->
# Toy grid: does POAD learn the toy?

## Question

Does it?

## Settings

The toy config, {updates}.

## Plan and rule, written before the cells ran

Read the final success.

## What the evidence shows

{shows}

## What it does not show

Anything else.
"""


def test_publish_sets_the_studys_reading_around_its_report_and_keeps_it(finished_grid, tmp_path):
    """`--report --publish` writes the page: the sidecar's title and sections (studies/<name>.md beside the
    study file) in the page's order, the report's group table and figures, the provenance line; a re-publish
    reads the sidecar again, and `--keep-report` writes the page from a changed sidecar keeping its report
    (no cells needed), as it does for a page published before the report's marks."""
    study_file, workdir, _ = finished_grid
    sidecar = study_file.with_suffix(".md")
    sidecar.write_text(SIDECAR.format(updates="two updates", shows="It learns."))
    published = tmp_path / "published"
    try:
        result = run_cli(f"--study={study_file}", f"--workdir={workdir}", "--report", f"--publish={published}")
        assert result.returncode == 0, result.stderr[-2000:]
        text = (published / "toy_grid.md").read_text()
        headings = [line for line in text.splitlines() if line.startswith("#")]
        assert headings == ["# Toy grid: does POAD learn the toy?", "## Question", "## Settings",
                            "## Plan and rule, written before the cells ran", "## Results",
                            "## What the evidence shows", "## What it does not show",
                            "## Command, commit, machines and wall time", "## Every table of the report"]
        assert "the reading of toy_grid" not in text and "It learns." in text and "| POAD | 2 |" in text
        assert "(toy_grid_return.png)" in text and "\nCommand `python -m poad_jax.study" in text
        blocks = page.ReportBlocks.from_page(text)
        sidecar.write_text(SIDECAR.format(updates="two updates", shows="It learns, on two seeds."))
        result = run_cli(f"--study={study_file}", f"--publish={published}", "--keep-report")
        assert result.returncode == 0, result.stderr[-2000:]
        kept = (published / "toy_grid.md").read_text()
        assert "It learns, on two seeds." in kept and page.ReportBlocks.from_page(kept) == blocks
        legacy = re.sub(r"\((\w+)\.png\)", r"(toy_grid_\1.png)", (workdir / "report.md").read_text())
        legacy += "\n" + blocks.provenance[0] + "\n"  # a page as published before the report's marks
        (published / "toy_grid.md").write_text(legacy)
        assert run_cli(f"--study={study_file}", f"--publish={published}", "--keep-report").returncode == 0
        assert (published / "toy_grid.md").read_text() == kept
        sidecar.write_text(SIDECAR.format(updates="x", shows="y").replace("## Settings", "## Setup"))
        one_line_error(run_cli(f"--study={study_file}", f"--publish={published}", "--keep-report"),
                       "section 'Setup' is not one of the page's")
        one_line_error(run_cli(f"--study={study_file}", "--keep-report"), "give --publish=DIR")
    finally:
        sidecar.unlink()


def test_provenance_names_each_cells_commits_and_counts_cut_off_invocations(tmp_path):
    """The published line says which commits the cells ran at (cells resumed across commits list each),
    which cells predate that record, and the wall time of every invocation, cut-off ones included."""
    study = spec.load_study(write_study(tmp_path, updates=1, methods=("poad", "ntpo", "twosome"), seeds=(0,)))
    workdir = tmp_path / "runs"
    record = [{"update": 1, "env_steps": 16, "episodes": 1, "episode_return": 0.0, "success_rate": 0.0}]
    for name, commits in (("POAD__seed=0", ["abc1234", "def5678"]), ("NTPO__seed=0", ["abc1234"]),
                          ("TWOSOME__seed=0", None)):
        _fake_cell(workdir, name, record, "done")
        if commits is not None:
            (workdir / "cells" / name / "cell.json").write_text(json.dumps({"status": "done", "commits": commits}))
    (workdir / "study.json").write_text(json.dumps({"sessions": [
        {"started": "2026-11-20T10:00:00Z", "seconds": 100.0, "cells_run": 1},  # written before `ended` existed
        {"started": "2026-11-21T10:00:00Z", "seconds": 50.0, "cells_run": 1, "ended": False},
        {"started": "2026-11-22T10:00:00Z", "seconds": 30.0, "cells_run": 1, "ended": True},
    ]}))
    line = report.provenance(study, workdir)
    assert "the cells' commits: abc1234 (2 cells), def5678 (1 cell), not recorded for 1 cell" in line
    assert "run 2026-11-20 to 2026-11-22; wall time 3m00s over 3 invocation(s), 1 of them cut off" in line
    assert f"report at {scheduler.repo_commit()};" in line


def test_each_invocation_records_its_machine_and_the_provenance_names_it(tmp_path, monkeypatch):
    """A study run on a lent GPU machine and reported here must name that machine: each invocation
    records `this_machine()` (cores, CPU model, NVIDIA GPUs from nvidia-smi) in study.json, and the
    provenance line lists the recorded machines; invocations that recorded none fall back to the
    reporting machine, said as such."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3'\necho 'NVIDIA H100 80GB HBM3'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert scheduler.this_machine() == f"{os.cpu_count()} cores, {_cpu_model()}, 2 x NVIDIA H100 80GB HBM3"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no nvidia-smi: no GPU words
    here = scheduler.this_machine()
    assert here == f"{os.cpu_count()} cores, {_cpu_model()}"

    study = spec.load_study(write_study(tmp_path, updates=1, seeds=(0,)))
    workdir = tmp_path / "runs"
    _fake_cell(workdir, "POAD__seed=0", [{"update": 1, "env_steps": 16, "episodes": 1, "episode_return": 0.0,
                                          "success_rate": 0.0}], "done")
    (workdir / "study.json").write_text(json.dumps({"sessions": [{"started": "2026-11-22T10:00:00Z",
                                                                  "seconds": 30.0, "ended": True}]}))
    assert f"; {here} (where this report was written: the invocations did not record theirs);" in \
        report.provenance(study, workdir)
    index = scheduler.open_session(workdir, time.time())
    sessions = json.loads((workdir / "study.json").read_text())["sessions"]
    assert index == 1 and sessions[1]["machine"] == here
    sessions[0]["machine"] = "16 cores, Some CPU, 1 x NVIDIA H100 80GB HBM3"
    (workdir / "study.json").write_text(json.dumps({"sessions": sessions}))
    line = report.provenance(study, workdir)
    assert f"; 16 cores, Some CPU, 1 x NVIDIA H100 80GB HBM3; {here}; run 2026-11-22" in line
    assert "did not record" not in line


def _cpu_model() -> str:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def test_the_step_outcome_table_weights_rewards_by_succeeded_step(tmp_path):
    """Report option `steps` (DataSciCoding: runnable programs and their AUC): counts, fraction, the mean
    reward of succeeded steps weighted by step (all and last 25%), the best reward, the actions cut off by
    the token limit ("-" for a run that does not log them); rows parsed back."""
    study = spec.load_study(write_study(
        tmp_path, updates=4, seeds=(0,), extra_report=', "final_fraction": 0.25, '
        '"steps": {"succeeded": "runnable", "reward": "AUC"}'))
    workdir = tmp_path / "runs"
    rng = np.random.default_rng(1)
    counts = [0, 3, 1, 5]  # programs that ran in each update of 16
    means = [None] + [float(rng.uniform(0.4, 0.9)) for _ in counts[1:]]
    records = [{"update": u + 1, "env_steps": 16 * (u + 1), "episodes": u, "episode_return": 0.0,
                "success_rate": 0.0, "steps_succeeded": k, "success_reward_mean": m,
                "best_step_reward": None if m is None else max(x for x in means[1:u + 1])}
               for u, (k, m) in enumerate(zip(counts, means))]
    cut = [2, 0, 7, 1]
    _fake_cell(workdir, "POAD__seed=0", [{**r, "actions_cut_off": c} for r, c in zip(records, cut)], "done")
    _fake_cell(workdir, "NTPO__seed=0", records[:2], "running")
    report.write_report(study, workdir)
    text = (workdir / "report.md").read_text()
    assert "| cell | status | env steps | runnable | fraction runnable | mean AUC of runnable |" in text
    rows = {c[0]: c for c in ([x.strip() for x in line.strip("|").split("|")] for line in text.splitlines())
            if len(c) == 9 and c[0] in ("POAD__seed=0", "NTPO__seed=0") and c[3].isdigit()}
    hand_mean = sum(k * m for k, m in zip(counts[1:], means[1:])) / sum(counts)
    assert rows["POAD__seed=0"][2:] == ["64", "9", f"{9 / 64:.3f}", f"{hand_mean:.3f}", f"{means[3]:.3f}",
                                        f"{max(means[1:]):.3f}", str(sum(cut))]  # last 25%: update 4 alone
    assert rows["NTPO__seed=0"][1] == "running (32 of 64)"
    assert rows["NTPO__seed=0"][3:] == ["3", f"{3 / 32:.3f}", f"{means[1]:.3f}", f"{means[1]:.3f}",
                                        f"{means[1]:.3f}", "-"]
    assert "![steps](steps.png)" in text and (workdir / "steps.png").stat().st_size > 0
    (tmp_path / "plain").mkdir()
    plain = spec.load_study(write_study(tmp_path / "plain", updates=4, seeds=(0,)))
    assert report.step_outcome_table(plain, workdir) == []
    report.write_report(plain, workdir)
    assert not (workdir / "steps.png").exists() and "steps.png" not in (workdir / "report.md").read_text()


def test_the_final_step_count_table_pools_succeeded_env_steps_with_wilson_intervals(tmp_path):
    """Report option `steps`: per group, the succeeded env steps in the last `final_fraction` of its finished
    cells' env steps, pooled over seeds, against sums by hand and `wilson_interval`; updates of unequal
    env steps count by their steps; a running cell and a study without `steps` give no row or table."""
    study = spec.load_study(write_study(
        tmp_path, updates=4, seeds=(0, 1), extra_report=', "final_fraction": 0.5, '
        '"steps": {"succeeded": "runnable", "reward": "AUC"}'))
    workdir = tmp_path / "runs"
    rng = np.random.default_rng(4)

    def records(steps, succeeded):
        return [{"update": u, "env_steps": int(t), "episodes": u, "episode_return": 0.0, "success_rate": 0.0,
                 "steps_succeeded": int(k), "success_reward_mean": 0.8 if k else None}
                for u, (t, k) in enumerate(zip(np.cumsum(steps), succeeded), start=1)]

    poad0 = (rng.integers(10, 20, size=4), rng.integers(0, 10, size=4))
    poad1 = ([16, 16, 16, 16], [1, 2, 3, 4])
    for name, (steps, succeeded) in {"POAD__seed=0": poad0, "POAD__seed=1": poad1}.items():
        _fake_cell(workdir, name, records(steps, succeeded), "done")
    _fake_cell(workdir, "NTPO__seed=0", records([16, 16], [5, 5]), "running")
    total = np.cumsum(poad0[0])
    last = total > 0.5 * total[-1]
    by_hand = (int(poad0[1][last].sum()), int((poad0[0] * last).sum()))
    assert report.step_successes(records(*poad0), 0.5) == by_hand
    assert report.step_successes(records(*poad1), 0.5) == (7, 32)
    assert report.step_successes([], 0.5) == (0, 0)
    report.write_report(study, workdir)
    text = (workdir / "report.md").read_text()
    section = text.split("Runnable env steps in the last 50% of env steps")[1]
    rows = [c for c in ([x.strip() for x in line.strip("|").split("|")] for line in section.splitlines())
            if len(c) == 7 and c[0] in ("POAD", "NTPO")]
    k, n = by_hand[0] + 7, by_hand[1] + 32
    low, high = report.wilson_interval(k, n)
    assert rows[0] == ["POAD", "2", str(n), str(k), f"0: {by_hand[0]}, 1: 7", f"{k / n:.3f}",
                       f"{low:.3f}-{high:.3f}"]
    assert len(rows) == 1 and "| group | finished cells | env steps | runnable | runnable per seed |" in section
    (tmp_path / "plain").mkdir()
    plain = spec.load_study(write_study(tmp_path / "plain", updates=4, seeds=(0, 1)))
    assert report.final_step_count_table(plain, workdir) == []


def _student_t_two_sided_p(t: float, df: float) -> float:
    """2 P(T_df > |t|) by the trapezoid rule over Student's t density (NumPy alone, no SciPy)."""
    x = np.linspace(abs(t), abs(t) + 2000.0, 2_000_001)
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    density = np.exp(log_c - (df + 1) / 2 * np.log1p(x ** 2 / df))
    return float(2 * np.sum((density[1:] + density[:-1]) / 2 * np.diff(x)))


def test_welch_test_against_its_formula_and_a_numeric_t_tail():
    """t and the Welch-Satterthwaite df against the formula written out in NumPy; p against the t density
    integrated numerically; too few values or no spread give NaN; NaN values are dropped."""
    rng = np.random.default_rng(5)
    for n_a, n_b in ((5, 5), (2, 7), (4, 3)):
        a, b = rng.normal(0.3, 0.2, n_a), rng.normal(0.0, 0.5, n_b)
        va, vb = np.var(a, ddof=1) / n_a, np.var(b, ddof=1) / n_b
        t, df, p = report.welch_test(list(a), list(b) + [math.nan])
        np.testing.assert_allclose(t, (a.mean() - b.mean()) / np.sqrt(va + vb), rtol=1e-12)
        np.testing.assert_allclose(df, (va + vb) ** 2 / (va ** 2 / (n_a - 1) + vb ** 2 / (n_b - 1)), rtol=1e-12)
        np.testing.assert_allclose(p, _student_t_two_sided_p(t, df), atol=2e-5)
    assert all(math.isnan(x) for x in report.welch_test([1.0], [0.0, 2.0]))
    assert all(math.isnan(x) for x in report.welch_test([1.0, 1.0], [2.0, 2.0]))


def test_the_pairs_table_tests_the_groups_it_names(tmp_path):
    """Report option `pairs`: one row per named pair with the difference of the seed means, the larger
    seed std and Welch's test on the finished cells' final values; an unnamed or malformed pair is a
    one-line StudyError."""
    study = spec.load_study(write_study(tmp_path, updates=2, seeds=(0, 1, 2), methods=("poad", "ntpo", "twosome"),
                                        extra_report=', "final_fraction": 0.5, "pairs": [("POAD", "NTPO")]'))
    workdir = tmp_path / "runs"
    finals = {"POAD": [0.9, 0.7, 0.8], "NTPO": [0.1, 0.4, 0.2]}
    for label, values in finals.items():
        for seed, value in enumerate(values):
            _fake_cell(workdir, f"{label}__seed={seed}",
                       [{"update": 1, "env_steps": 16, "episodes": 1, "episode_return": -5.0, "success_rate": 0.0},
                        {"update": 2, "env_steps": 32, "episodes": 2, "episode_return": value,
                         "success_rate": 0.0}], "done")
    report.write_report(study, workdir)
    text = (workdir / "report.md").read_text()
    rows = [[x.strip() for x in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| POAD - NTPO |")]
    t, df, p = report.welch_test(finals["POAD"], finals["NTPO"])
    std = max(np.std(finals["POAD"], ddof=1), np.std(finals["NTPO"], ddof=1))
    assert rows == [["POAD - NTPO", "3, 3", f"{0.8 - 0.7 / 3:.3f}", f"{std:.3f}", f"{t:.3f}", f"{df:.1f}",
                     f"{p:.3f}"]]
    assert "TWOSOME - " not in text and "Pairs of groups (final episode_return per seed" in text
    for bad, words in (('[("POAD", "A2C")]', "pairs names no group ['A2C']"),
                       ('[("POAD", "POAD")]', "report option pairs must be a list of"),
                       ('"POAD"', "report option pairs must be a list of")):
        (tmp_path / "bad").mkdir(exist_ok=True)
        path = write_study(tmp_path / "bad", extra_report=f', "pairs": {bad}')
        with pytest.raises(spec.StudyError, match=re.escape(words)):
            spec.load_study(path)


def test_cut_off_count_only_when_every_update_logged_it():
    """A run that logged `actions_cut_off` from its start sums it; one that began logging it mid-way
    (copied-in or older updates) shows none rather than a partial sum that reads as the whole."""
    records = [{"env_steps": 8 * (u + 1), "steps_succeeded": 1, "success_reward_mean": 0.5, "actions_cut_off": c}
               for u, c in enumerate([2, 0, 3])]
    assert report.step_outcomes(records, 0.25).cut_off == 5
    records[0].pop("actions_cut_off")
    assert report.step_outcomes(records, 0.25).cut_off is None
    assert report.step_outcomes([{k: v for k, v in r.items() if k != "actions_cut_off"} for r in records],
                                0.25).cut_off is None


def test_step_curves_per_update_share_mean_best_kl_entropy():
    """`figures.step_curves` against the hand computation: the share of an update's own env steps that
    succeeded and that the token limit cut off (updates of unequal size), the succeeded steps' mean reward
    (NaN where none), the best so far, KL and entropy passed through; a missing value is NaN, never 0."""
    rng = np.random.default_rng(4)
    sizes, counts = [8, 8, 16, 8], [0, 5, 3, 8]
    steps = np.cumsum(sizes)
    means = [None, *rng.uniform(0.4, 0.9, 3).tolist()]
    kls, entropies = rng.uniform(1e-5, 1e-2, 4).tolist(), rng.uniform(0.1, 2.0, 4).tolist()
    cut = [3, 0, 5, 2]
    records = [{"env_steps": int(s), "steps_succeeded": k, "success_reward_mean": m, "approx_kl": kl,
                "entropy": e, "best_step_reward": None if m is None else max(x for x in means[1:u + 1]),
                "actions_cut_off": c}
               for u, (s, k, m, kl, e, c) in enumerate(zip(steps, counts, means, kls, entropies, cut))]
    records[2].pop("entropy")
    records[1].pop("actions_cut_off")
    curves = figures.step_curves(records)
    assert set(curves) == set(figures.STEP_PANELS)
    for panel, (x, _) in curves.items():
        np.testing.assert_array_equal(x, steps, err_msg=panel)
    np.testing.assert_allclose(curves["share"][1], [0 / 8, 5 / 8, 3 / 16, 8 / 8])
    np.testing.assert_allclose(curves["cut_off"][1], [3 / 8, np.nan, 5 / 16, 2 / 8])
    assert figures.logged_panels([curves]) == list(figures.STEP_PANELS)
    unlogged = figures.step_curves([{k: v for k, v in r.items() if k != "actions_cut_off"} for r in records])
    assert figures.logged_panels([unlogged]) == [p for p in figures.STEP_PANELS if p != "cut_off"]
    assert figures.logged_panels([unlogged, curves]) == list(figures.STEP_PANELS)
    assert figures.logged_panels([]) == []
    np.testing.assert_allclose(curves["mean"][1], [np.nan, *means[1:]])
    np.testing.assert_allclose(curves["best"][1], [np.nan, means[1], max(means[1:3]), max(means[1:])])
    np.testing.assert_allclose(curves["approx_kl"][1], kls)
    np.testing.assert_allclose(curves["entropy"][1], [entropies[0], entropies[1], np.nan, entropies[3]])



def test_wilson_interval_equals_scipys():
    """The score interval against scipy's binomtest (an independent implementation), k = 0 and k = n included."""
    from scipy import stats
    for k, n in [(0, 28), (1, 60), (2, 60), (3, 120), (30, 60), (60, 60), (7, 9)]:
        expected = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
        np.testing.assert_allclose(report.wilson_interval(k, n), (expected.low, expected.high), rtol=1e-9, atol=1e-12)
    assert all(np.isnan(report.wilson_interval(0, 0)))


def test_the_report_pools_successful_episodes_per_group_from_the_per_update_rates(tmp_path):
    """Successful episodes are counted per update as rate x episodes ended in it (an update that ended
    none, or whose rate is unknown, adds nothing), summed over a group's cells, running ones included,
    with Wilson's interval; a second table counts the finished cells' last `final_fraction` of env steps
    alone (the pre-registered rules of study A read it); a study whose cells know no success rate has
    neither table."""
    study = spec.load_study(write_study(tmp_path, updates=4, seeds=(0, 1)))
    workdir = tmp_path / "runs"
    rng = np.random.default_rng(2)

    def records(ended, successes, unknown=()):
        out, total = [], 0
        for u, (e, k) in enumerate(zip(ended, successes), start=1):
            total += e
            rate = None if u in unknown else (k / e if e else None)
            out.append({"update": u, "env_steps": 16 * u, "episodes": total, "episode_return": float(rng.uniform()),
                        "success_rate": rate})
        return out

    cells = {"POAD__seed=0": ([3, 0, 5, 4], [1, 0, 2, 3], ()), "POAD__seed=1": ([2, 6, 1, 3], [0, 1, 0, 0], (2,)),
             "NTPO__seed=0": ([4, 4], [0, 0], ())}
    for name, (ended, successes, unknown) in cells.items():
        _fake_cell(workdir, name, records(ended, successes, unknown), "done" if len(ended) == 4 else "running")
    assert report.episode_successes(records([3, 0, 5, 4], [1, 0, 2, 3])) == (6, 12)
    assert report.episode_successes(records([2, 6, 1, 3], [0, 1, 0, 0], unknown=(2,))) == (0, 6)
    report.write_report(study, workdir)
    text = (workdir / "report.md").read_text()
    pooled, final = text.split("Successful episodes per group")[1].split("Successful episodes in the last 10%")

    def table(section):
        return {c[0]: c for c in ([x.strip() for x in line.strip("|").split("|")] for line in section.splitlines())
                if len(c) == 7 and c[0] in ("POAD", "NTPO")}

    rows = table(pooled)
    low, high = report.wilson_interval(6, 18)
    assert rows["POAD"][1:] == ["2", "18", "6", "0: 6, 1: 0", f"{6 / 18:.3f}", f"{low:.3f}-{high:.3f}"]
    assert rows["NTPO"][1:5] == ["1", "8", "0", "0: 0"] and rows["NTPO"][5] == "0.000"
    assert tables._pooled_success_table("t", "cells", {(("variant", "TWOSOME"),): [(0, 0, 0)],
                                                     (("variant", "POAD"),): [(0, 1, 2)]})[-2] == (
        "| TWOSOME | 1 | 0 | 0 | 0: 0 | - | - |")  # a cell that has ended no episode yet
    # the last 10 % of 64 env steps is update 4 alone; the running NTPO cell is left out
    assert report.episode_successes(records([3, 0, 5, 4], [1, 0, 2, 3]), fraction=0.1) == (3, 4)
    assert report.episode_successes(records([3, 0, 5, 4], [1, 0, 2, 3]), fraction=0.5) == (5, 9)
    rows = table(final)  # the later tables' rows have other shapes or name cells
    low, high = report.wilson_interval(3, 7)
    assert set(rows) == {"POAD"}
    assert rows["POAD"][1:] == ["2", "7", "3", "0: 3, 1: 0", f"{3 / 7:.3f}", f"{low:.3f}-{high:.3f}"]
    for name in cells:
        path = workdir / "cells" / name / "metrics.jsonl"
        path.write_text("".join(json.dumps({**r, "success_rate": None}) + "\n" for r in scheduler.read_records(
            workdir / "cells" / name)))
    assert report.success_count_table(study, workdir) == []
    assert report.final_success_count_table(study, workdir) == []



def test_the_dynamics_table_reads_kl_entropy_skips_and_time_per_update(tmp_path):
    """Median and max approx KL, the entropy at the first, half-way and last update, the critic's median and
    min explained variance (an update without it skipped), skipped minibatch
    steps out of all (10 per update here, recovered from the skipped fraction), the median time per
    update: against NumPy over the same fake records; cells without approx_kl get no row, and a line names them."""
    study = spec.load_study(write_study(tmp_path, updates=5, seeds=(0,)))
    workdir = tmp_path / "runs"
    rng = np.random.default_rng(3)
    kl, entropy = rng.uniform(1e-4, 2e-2, size=5), rng.uniform(2.0, 2.8, size=5)
    variance = [-3.5, 0.2, None, 0.7, 0.4]
    skipped = [3, 0, 1, 0, 6]
    seconds = rng.uniform(1, 100, size=(5, len(report.PHASE_SECONDS)))
    records = [{"update": u + 1, "env_steps": 16 * (u + 1), "episodes": u, "episode_return": 0.0,
                "approx_kl": float(kl[u]), "entropy": float(entropy[u]), "skipped_minibatches": float(skipped[u]),
                "explained_variance": variance[u],
                "skipped": skipped[u] / 10, **dict(zip(report.PHASE_SECONDS, map(float, seconds[u])))}
               for u in range(5)]
    _fake_cell(workdir, "POAD__seed=0", records, "done")
    _fake_cell(workdir, "NTPO__seed=0", [{k: v for k, v in r.items() if k != "approx_kl"} for r in records],
               "done")
    row = report.training_dynamics(records)
    assert (row.updates, row.skipped, row.steps) == (5, 10, 50)
    np.testing.assert_allclose([row.median_kl, row.max_kl, row.median_seconds],
                               [np.median(kl), kl.max(), np.median(seconds.sum(axis=1))])
    np.testing.assert_allclose(row.entropy, entropy[[0, 2, 4]])
    np.testing.assert_allclose(row.explained_variance, [np.median([-3.5, 0.2, 0.7, 0.4]), -3.5])
    report.write_report(study, workdir)
    lines = [line for line in (workdir / "report.md").read_text().splitlines() if line.count("|") == 8]
    rows = [line.split("|")[1].strip() for line in lines if "->" in line and "__seed=" in line]
    assert rows == ["POAD__seed=0"]
    unlearned = [line for line in (workdir / "report.md").read_text().splitlines() if "No learner ran" in line]
    assert len(unlearned) == 1 and "NTPO__seed=0" in unlearned[0] and "POAD__seed=0" not in unlearned[0]
    assert f"| 0.300 (-3.500) | 10 of 50 | {scheduler.format_seconds(np.median(seconds.sum(axis=1)))} |" in "".join(lines)
    assert report.training_dynamics([{k: v for k, v in r.items() if k != "approx_kl"} for r in records]) is None


def test_the_dynamics_table_names_cells_whose_policy_loss_is_zero_in_every_update(tmp_path):
    """A cell with advantages whose policy loss is exactly 0 (-0.0 included) in every update had no policy
    gradient: the report names it under the dynamics table; one non-zero update, no logged policy loss, or
    advantages that are all 0 (no reward yet: nothing to normalise away) clear it."""
    study = spec.load_study(write_study(tmp_path, updates=4, seeds=(0,)))
    workdir = tmp_path / "runs"
    base = [{"update": u + 1, "env_steps": 16 * (u + 1), "episodes": u, "episode_return": 0.0,
             "approx_kl": 1e-4, "entropy": 2.0, "advantage_mean": 0.01 * (u - 1)} for u in range(4)]
    zero = [{**r, "policy_loss": [0.0, -0.0][r["update"] % 2]} for r in base]
    moved = [{**r, "policy_loss": 0.0 if r["update"] < 4 else -1e-9} for r in base]
    unrewarded = [{**r, "advantage_mean": 0.0} for r in zero]
    _fake_cell(workdir, "POAD__seed=0", zero, "done")
    _fake_cell(workdir, "NTPO__seed=0", moved, "done")
    assert report.training_dynamics(zero).no_policy_gradient
    assert not report.training_dynamics(moved).no_policy_gradient
    assert not report.training_dynamics(base).no_policy_gradient
    assert not report.training_dynamics(unrewarded).no_policy_gradient
    report.write_report(study, workdir)
    flagged = [line for line in (workdir / "report.md").read_text().splitlines() if "No policy gradient" in line]
    assert len(flagged) == 1 and "POAD__seed=0" in flagged[0] and "NTPO__seed=0" not in flagged[0]


def test_the_dynamics_table_names_cells_whose_advantages_are_zero_in_every_update(tmp_path):
    """Every advantage 0 in every update (a group method's groups_with_signal 0 throughout, or, in
    records without it, advantage_mean exactly 0 throughout) is named under the dynamics table; one
    update with signal, or no logged advantages, clears it."""
    study = spec.load_study(write_study(tmp_path, updates=4, seeds=(0,), methods=("poad", "ntpo", "twosome")))
    workdir = tmp_path / "runs"
    base = [{"update": u + 1, "env_steps": 16 * (u + 1), "episodes": u, "episode_return": 0.0,
             "approx_kl": 1e-4, "entropy": 2.0, "policy_loss": 0.0, "advantage_mean": 0.0} for u in range(4)]
    silent_groups = [{**r, "groups_with_signal": 0, "groups": 1} for r in base]
    one_signal = [{**r, "groups_with_signal": int(r["update"] == 3), "groups": 1} for r in base]
    moved = [{**r, "advantage_mean": 0.0 if r["update"] < 4 else 1e-7} for r in base]
    unlogged = [{k: v for k, v in r.items() if k != "advantage_mean"} for r in base]
    assert report.training_dynamics(base).no_advantage and report.training_dynamics(silent_groups).no_advantage
    for records in (one_signal, moved, unlogged):
        assert not report.training_dynamics(records).no_advantage
    _fake_cell(workdir, "POAD__seed=0", silent_groups, "done")
    _fake_cell(workdir, "NTPO__seed=0", one_signal, "done")
    _fake_cell(workdir, "TWOSOME__seed=0", silent_groups[:2], "running")  # not flagged before it ends
    report.write_report(study, workdir)
    text = (workdir / "report.md").read_text()
    flagged = [line for line in text.splitlines() if "Every advantage 0" in line]
    assert len(flagged) == 1 and "POAD__seed=0" in flagged[0]
    assert "NTPO__seed=0" not in flagged[0] and "TWOSOME__seed=0" not in flagged[0]
    assert "| TWOSOME__seed=0 (running) | 2 |" in text and "| POAD__seed=0 | 4 |" in text
    critic = [{**r, "explained_variance": 0.5, "value_loss": 0.1} for r in base]
    no_critic = [{**r, "explained_variance": 0.0, "value_loss": 0.0} for r in base]  # as GRPO logs them
    assert report.training_dynamics(critic).explained_variance == (0.5, 0.5)
    assert all(math.isnan(v) for v in report.training_dynamics(no_critic).explained_variance)



def test_the_report_names_finished_cells_that_logged_the_same_numbers(tmp_path):
    """Finished cells whose every update logged the same values (timings, compile counts and memory
    aside) are named together, each set once; one differing value anywhere, a missing key, or a cell
    still running keeps a cell out; no such cells, no line."""
    study = spec.load_study(write_study(tmp_path, updates=4, seeds=(0, 1), methods=("poad", "ntpo", "twosome")))
    workdir = tmp_path / "runs"
    rng = np.random.default_rng(5)
    base = [{"update": u + 1, "env_steps": 16 * (u + 1), "episodes": u, "episode_return": 0.0,
             "approx_kl": float(rng.uniform(1e-5, 1e-3)), "entropy": float(rng.uniform(0.1, 0.3))}
            for u in range(4)]

    def timed(records):  # other timings, compile counts and memory: still the same run
        return [{**r, "seconds_learner": float(rng.uniform(1, 9)), "compiles_sampler": int(rng.integers(1, 5)),
                 "peak_rss_mb": float(rng.uniform(900, 2000))} for r in records]

    one_differs = [dict(r) for r in base]
    one_differs[2]["entropy"] = np.nextafter(one_differs[2]["entropy"], 1.0)
    _fake_cell(workdir, "POAD__seed=0", timed(base), "done")
    _fake_cell(workdir, "NTPO__seed=0", timed(base), "done")
    _fake_cell(workdir, "TWOSOME__seed=0", timed(one_differs), "done")
    _fake_cell(workdir, "POAD__seed=1", timed(base)[:3], "running")
    _fake_cell(workdir, "NTPO__seed=1", [{k: v for k, v in r.items() if k != "entropy"} for r in base], "done")
    assert report.learning_numbers(timed(base)) == report.learning_numbers(base)
    assert report.learning_numbers(one_differs) != report.learning_numbers(base)
    lines = report.same_numbers_lines(study, workdir)
    assert len(lines) == 1 and lines[0].startswith("**Same numbers** in POAD__seed=0 and NTPO__seed=0:")
    for name in ("TWOSOME__seed=0", "POAD__seed=1", "NTPO__seed=1"):
        assert name not in lines[0]
    report.write_report(study, workdir)
    assert lines[0] in (workdir / "report.md").read_text()
    _fake_cell(workdir, "TWOSOME__seed=1", timed(base), "done")
    assert "POAD__seed=0, NTPO__seed=0 and TWOSOME__seed=1:" in report.same_numbers_lines(study, workdir)[0]
    (workdir / "cells" / "NTPO__seed=0" / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in one_differs))
    (workdir / "cells" / "TWOSOME__seed=1" / "cell.json").write_text(json.dumps({"status": "running"}))
    lines = report.same_numbers_lines(study, workdir)  # POAD seed 0 alone now; NTPO seed 0 as TWOSOME's
    assert len(lines) == 1 and lines[0].startswith("**Same numbers** in NTPO__seed=0 and TWOSOME__seed=0:")

def test_a_cell_declared_the_same_computation_as_another_is_not_run_and_takes_its_numbers(tmp_path):
    """`same_as`: the declared cell never runs (a line says so), the other cell's logs stand for it in the
    group rows, the per-cell table (marked) and the success counts, it is kept out of the "Same numbers"
    check (which it would pass by construction) and named in a line of its own; logs of its own in the
    workdir stop both a run and a report with one line."""
    study_file = write_study(tmp_path, updates=4, seeds=(0, 1), methods=("poad", "ntpo"),
                             extra='\n        "same_as": {"NTPO__seed=0": "POAD__seed=0"},')
    study = spec.load_study(study_file)
    assert study.same_as == {"NTPO__seed=0": "POAD__seed=0"}
    workdir = tmp_path / "runs"
    assert spec.log_dir(study, workdir, "NTPO__seed=0") == workdir / "cells" / "POAD__seed=0"
    assert spec.log_dir(study, workdir, "NTPO__seed=1") == workdir / "cells" / "NTPO__seed=1"
    succeeding = [{"update": u + 1, "env_steps": 16 * (u + 1), "episodes": 2 * (u + 1), "episode_return": 1.0,
                   "success_rate": 1.0, "seconds_learner": 3.0} for u in range(4)]
    failing = [{**r, "episode_return": 0.0, "success_rate": 0.0} for r in succeeding]
    cells = {cell.name: cell for cell in spec.grid(study)}
    for name, records in (("POAD__seed=0", succeeding), ("NTPO__seed=1", failing)):
        _fake_cell(workdir, name, records, "done")  # with the overrides a run records, as the runner checks
        (workdir / "cells" / name / "cell.json").write_text(json.dumps(
            {"status": "done", "overrides": scheduler._comparable(cells[name].overrides)}))
    results = {r.label: r for r in report.aggregate(study, workdir)}
    assert results["NTPO"].seeds == [0, 1] and results["NTPO"].finals == [1.0, 0.0]
    assert results["POAD"].seeds == [0] and results["POAD"].finals == [1.0]
    rows = {line.split(" | ")[0].lstrip("| "): line for line in report.cell_table(study, workdir)[2:]}
    assert "not run: POAD__seed=0's numbers (done)" in rows["NTPO__seed=0"] and rows["NTPO__seed=0"].endswith("| - |")
    assert "not run" not in rows["POAD__seed=0"] and "not run" not in rows["NTPO__seed=1"]
    assert report.same_numbers_lines(study, workdir) == []  # NTPO seed 0 is POAD seed 0's own logs
    assert report.not_run_lines(study) == [
        "**Not run**, as the same computation as a cell that ran (the study file's `same_as`), whose numbers "
        "stand for them in every table and figure: NTPO__seed=0 (POAD__seed=0's)."]
    assert report.not_run_lines(dataclasses.replace(study, seeds=(1,))) == []  # a report of seed 1 alone
    report.write_report(study, workdir)
    text = (workdir / "report.md").read_text()
    assert report.not_run_lines(study)[0] in text
    counts = "\n".join(report.success_count_table(study, workdir))
    assert "| NTPO | 2 |" in counts, counts
    logged: list[str] = []
    assert scheduler.run_study(study, workdir, cell_names=("NTPO__seed=0",), log=logged.append) == {}
    assert any("NTPO__seed=0 is not run" in line and "POAD__seed=0" in line for line in logged), logged
    assert not (workdir / "cells" / "NTPO__seed=0").exists()
    _fake_cell(workdir, "NTPO__seed=0", failing, "done")  # it ran after all: its logs would be hidden
    with pytest.raises(spec.StudyError, match="NTPO__seed=0 has run"):
        scheduler.run_study(study, workdir, cell_names=("NTPO__seed=1",), log=logged.append)
    result = run_cli(f"--study={study_file}", f"--workdir={workdir}", "--report")
    assert result.returncode == 2 and "NTPO__seed=0 has run" in result.stderr and "Traceback" not in result.stderr


def test_a_cell_declared_the_same_computation_as_a_sibling_studys_cell_takes_that_cells_numbers(tmp_path):
    """`same_as` with "<study>/<cell>": a later step's cell that repeats a computation an earlier study ran
    (there itself declared the same as another cell, say) reads the sibling workdir's cell, is not run, and
    a run says so, or says that the sibling cell has no logs yet."""
    study_file = write_study(tmp_path, updates=4, seeds=(0, 1), methods=("poad", "ntpo"),
                             extra='\n        "same_as": {"NTPO__seed=0": "step_1/POAD__seed=0"},')
    study = spec.load_study(study_file)
    runs = tmp_path / "runs"
    workdir, sibling = runs / "toy_grid", runs / "step_1"
    assert spec.log_dir(study, workdir, "NTPO__seed=0") == sibling / "cells" / "POAD__seed=0"
    assert spec.log_dir(study, workdir, "POAD__seed=0") == workdir / "cells" / "POAD__seed=0"
    logged: list[str] = []
    assert scheduler.run_study(study, workdir, cell_names=("NTPO__seed=0",), log=logged.append) == {}
    assert any("NTPO__seed=0 is not run" in line and "step_1/POAD__seed=0" in line and "none there yet" in line
               for line in logged), logged
    records = [{"update": u + 1, "env_steps": 16 * (u + 1), "episodes": 2 * (u + 1), "episode_return": 1.0,
                "success_rate": 1.0, "seconds_learner": 3.0} for u in range(4)]
    _fake_cell(sibling, "POAD__seed=0", records, "done")
    _fake_cell(workdir, "NTPO__seed=1", [{**r, "episode_return": 0.0, "success_rate": 0.0} for r in records], "done")
    ntpo_1 = next(cell for cell in spec.grid(study) if cell.name == "NTPO__seed=1")
    (workdir / "cells" / "NTPO__seed=1" / "cell.json").write_text(json.dumps(  # the overrides a run records
        {"status": "done", "overrides": scheduler._comparable(ntpo_1.overrides)}))
    logged.clear()
    assert scheduler.run_study(study, workdir, cell_names=("NTPO__seed=0",), log=logged.append) == {}
    assert any("NTPO__seed=0 is not run" in line and "none there yet" not in line for line in logged), logged
    assert not (workdir / "cells" / "NTPO__seed=0").exists()
    results = {r.label: r for r in report.aggregate(study, workdir)}
    assert results["NTPO"].seeds == [0, 1] and results["NTPO"].finals == [1.0, 0.0]
    rows = {line.split(" | ")[0].lstrip("| "): line for line in report.cell_table(study, workdir)[2:]}
    assert "not run: step_1/POAD__seed=0's numbers (done)" in rows["NTPO__seed=0"]
    assert "POAD__seed=0" not in rows  # this study's own POAD seed 0 has not run


@pytest.mark.parametrize("same_as, message", [
    ('"POAD__seed=7": "POAD__seed=0"', "'POAD__seed=7', which is not one of its cells"),
    ('"NTPO__seed=0": "NTPO__seed=0"', "a cell that does not run itself"),
    ('"NTPO__seed=0": "POAD__seed=0", "POAD__seed=0": "POAD__seed=1"', "a cell that does not run itself"),
    ('"NTPO__seed=0": "step_1/POAD/seed=0"', "another study's cell is named <study>/<cell>"),
    ('"NTPO__seed=0": "/POAD__seed=0"', "another study's cell is named <study>/<cell>"),
    ('"NTPO__seed=0": "toy_grid/POAD__seed=0"', "another study's cell is named <study>/<cell>"),
])
def test_a_malformed_same_as_fails_when_the_study_loads(tmp_path, same_as, message):
    study_file = write_study(tmp_path, seeds=(0, 1), extra=f'\n        "same_as": {{{same_as}}},')
    with pytest.raises(spec.StudyError, match=re.escape(message)):
        spec.load_study(study_file)
    study_file = write_study(tmp_path, seeds=(0, 1), extra='\n        "same_as": ["NTPO__seed=0"],')
    with pytest.raises(spec.StudyError, match="same_as must map cell names to cell names"):
        spec.load_study(study_file)


def test_a_reference_option_sets_published_numbers_beside_the_groups_and_bad_ones_fail_at_load(tmp_path):
    """Report option `reference` (e.g. the paper's Appendix H): a column of the group table (a range, a
    single value, "-" for a group it does not name) and dashed lines on the return figure; a malformed
    option or one naming no group of the study is a one-line StudyError when the study loads."""
    reference = ', "reference": {"label": "paper (7B)", "values": {"POAD": (0.77, 0.70), "NTPO": 0.5}}'
    study = spec.load_study(write_study(tmp_path, updates=2, seeds=(0,), methods=("poad", "ntpo", "twosome"),
                                        extra_report=reference))
    workdir = tmp_path / "runs"
    for name in ("POAD__seed=0", "NTPO__seed=0", "TWOSOME__seed=0"):
        _fake_cell(workdir, name, [{"update": u, "env_steps": 16 * u, "episodes": u, "episode_return": 0.3,
                                    "success_rate": 0.0} for u in (1, 2)], "done")
    report.write_report(study, workdir)
    text = (workdir / "report.md").read_text()
    assert "| group | seeds | final episode_return | final success | env steps to episode_return >= 0.5 | " \
           "paper (7B) |" in text
    rows = {c[0]: c for c in ([x.strip() for x in line.strip("|").split("|")] for line in text.splitlines())
            if len(c) == 6}
    assert (rows["POAD"][5], rows["NTPO"][5], rows["TWOSOME"][5]) == ("0.7-0.77", "0.5", "-")
    assert (workdir / "return.png").stat().st_size > 1000
    for bad, message in ((', "reference": {"values": {"POAD": 0.7}}', '{"label"'),
                         (', "reference": {"label": "x", "values": {"POAD": "high"}}', "for 'POAD' must be"),
                         (', "reference": {"label": "x", "values": {"PAOD": 0.7}}', "names no group ['PAOD']")):
        directory = tmp_path / f"bad{len(message)}"
        directory.mkdir()
        with pytest.raises(spec.StudyError, match=re.escape(message)):
            spec.load_study(write_study(directory, extra_report=bad))


def test_report_options_are_one_typed_declaration_read_once_and_a_bad_one_fails_at_load(tmp_path):
    """Every report option is a field of `spec.ReportOptions` with its type, default, one-line meaning and
    check; `load_study` reads the study file's `report` into it once (options left out keep their
    defaults), and an unknown or malformed option is a one-line StudyError naming it."""
    for field in dataclasses.fields(spec.ReportOptions):
        meaning = field.metadata["meaning"]
        assert meaning and "\n" not in meaning and callable(field.metadata["parse"]), field.name
    options = spec.load_study(write_study(tmp_path, extra_report=', "final_fraction": 0.25, "facet": "variant"')
                              ).report_options
    assert (options.metric, options.threshold, options.smoothing, options.final_fraction, options.facet) == (
        "episode_return", 0.5, 1, 0.25, "variant")
    assert (options.steps, options.success_speed, options.heatmap, options.theory) == (None, None, None, None)
    assert options.reference == spec.Reference("", {}) and options.best_programs == spec.BestPrograms()
    for bad, message in ((', "smothing": 5', "unknown report option 'smothing'; the options are metric, "),
                         (', "final_fraction": 0', "report option final_fraction must be a fraction"),
                         (', "facet": "seed"', "report option facet must be one of the study's axes ('variant'), "
                                               "got 'seed'"),
                         (', "heatmap": ["variant"]', "report option heatmap must be (row axis, column axis)"),
                         (', "steps": {"reward": 3}', "report option steps must be"),
                         (', "theory": "theory.optimum"', "report option theory must be \"module:function\""),
                         (', "metric": ""', "report option metric must be")):
        directory = tmp_path / f"bad{len(list(tmp_path.iterdir()))}"
        directory.mkdir()
        with pytest.raises(spec.StudyError) as error:
            spec.load_study(write_study(directory, extra_report=bad))
        assert message in str(error.value) and "\n" not in str(error.value), (bad, str(error.value))


@pytest.mark.parametrize("path", sorted((REPO / "studies").glob("*.py")), ids=lambda p: p.stem)
def test_every_study_of_the_repository_builds_a_valid_config_for_each_cell(path):
    """The shipped study files (the commands of docs/results/) load, and every cell's trainer config passes
    the trainer's validation, so a misspelt override fails here rather than hours into a study."""
    study = spec.load_study(path)
    cells = spec.grid(study)
    assert cells and len({cell.name for cell in cells}) == len(cells)
    for cell in cells:
        spec.cell_config(study, cell)


PUBLISHED = REPO / "docs" / "results" / "raw"  # snapshots of the paper-task studies' cells


def study_named(name: str) -> spec.Study:
    """The repository's study of that name, or the one that names it among its `former_names` (a pass that
    ran some of its cells under a name of its own before `--cells`)."""
    found = [study for study in map(spec.load_study, sorted((REPO / "studies").glob("*.py")))
             if name == study.name or name in study.former_names]
    assert len(found) == 1, (name, [study.name for study in found])
    return found[0]


@pytest.mark.parametrize("snapshot", sorted(str(p.parent.relative_to(PUBLISHED)) for p in
                                             [*PUBLISHED.glob("*/study.json"), *PUBLISHED.glob("*/*/study.json")]))
def test_a_published_study_still_builds_the_cells_it_ran(snapshot):
    """Its study file and base config still describe the published cells (snapshots of studies run on
    another machine sit one folder down, e.g. h100_2026-11-25/<study>; a snapshot recorded by a pass under
    a name of its own is read by the study that names it in `former_names`): the workdir is recognised as
    this study's, and every cell's trainer config equals the config.json it ran with (fields added to
    the trainer since count at their defaults; "auto" settings resolve to the recorded choice, as the
    trainer resolves them on a resume; a field whose change leaves the numbers and only changes how they
    are computed, "speed" such as `remat`, whose DataSciCoding default went from "dots" to "full", may
    differ, as a resume lets it), so re-running the study resumes rather than refusing."""
    from poad_jax.run import hardware, rundir

    published = PUBLISHED / snapshot
    study = study_named(published.name)
    assert study.recorded_in(json.loads((published / "study.json").read_text()))
    compared = 0
    for cell in spec.grid(study):
        recorded = published / cell.name / "config.json"
        if not recorded.is_file():  # a cell reused from a sibling study: only a note is kept
            continue
        ran = json.loads(recorded.read_text())
        config = spec.cell_config(study, cell).copy_and_resolve_references()
        hardware.resolve_config(config, ran)  # "auto" settings resolve to the recorded choice, as a rerun's do
        refused, safe = rundir.config_differences(ran, rundir.config_as_json(config))
        assert refused == [], (cell.name, refused)
        recorded_fields = rundir.flatten(ran)  # a resumable field added since (at its default there) may differ
        changed = {field: old for field, (old, _) in safe.items()
                   if field in recorded_fields  # a first pass ran fewer steps; a speed setting's default may move
                   and config_lib.resumable_kind(field) not in ("length", "speed")}
        assert changed == {}, (cell.name, safe)
        compared += 1
    assert compared


def test_the_snapshot_script_copies_a_studys_small_files_to_the_destination_it_is_given(tmp_path):
    """scripts/snapshot_studies.sh RUNS DEST: study.json and each cell's small files (not its checkpoints
    or train logs) land in DEST/<study>/<cell>, its JSON-lines logs gzipped (`tools.rawlogs pack`); a reused
    cell (a symlink) leaves a REUSED note."""
    runs, dest = tmp_path / "runs", tmp_path / "dest"
    cell = runs / "grid" / "cells" / "POAD__seed=0"
    (cell / "checkpoints" / "3").mkdir(parents=True)
    (cell / "checkpoints" / "3" / "state").write_bytes(b"x" * 100)
    (runs / "grid" / "study.json").write_text('{"identity": "grid"}')
    for name in ("metrics.jsonl", "config.json", "cell.json", "finished.json", "train.log", "evaluation.txt",
                 "evaluation_token.txt", "evaluate_token.log", "behaviour_gap.md", "behaviour_gap.log"):
        (cell / name).write_text(name)
    (cell / "actions.jsonl").write_text('{"update": 1, "env_step": 1, "action": "walk"}\n')
    (cell / "behaviour_gap_steps.jsonl").write_text('{"episode": 0, "mu": 0.2, "pi": 0.01}\n')
    (runs / "other" / "cells" / "NTPO__seed=0").mkdir(parents=True)
    (runs / "other" / "cells" / "NTPO__seed=0" / "metrics.jsonl").write_text("{}")
    (runs / "grid" / "cells" / "NTPO__seed=0").symlink_to(runs / "other" / "cells" / "NTPO__seed=0")
    done = subprocess.run(["bash", str(REPO / "scripts" / "snapshot_studies.sh"), str(runs), str(dest)],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr
    copied = dest / "grid" / "POAD__seed=0"
    assert sorted(p.name for p in copied.iterdir()) == ["actions.jsonl.gz", "behaviour_gap.md",
                                                        "behaviour_gap_steps.jsonl.gz", "cell.json", "config.json",
                                                        "evaluation.txt", "evaluation_token.txt", "finished.json",
                                                        "metrics.jsonl.gz"]
    assert action_log.read_actions(copied) == [{"update": 1, "env_step": 1, "action": "walk"}]  # read back, gzipped
    assert gzip.decompress((copied / "behaviour_gap_steps.jsonl.gz").read_bytes()) == \
        (cell / "behaviour_gap_steps.jsonl").read_bytes()
    assert gzip.decompress((copied / "metrics.jsonl.gz").read_bytes()) == b"metrics.jsonl"
    assert (dest / "grid" / "study.json").read_text() == '{"identity": "grid"}'
    assert (dest / "grid" / "NTPO__seed=0" / "REUSED").read_text().startswith("reused: ")
    assert not (dest / "other").exists()  # no study.json: not a study


def test_the_gpu_script_reports_each_cells_env_steps_and_successes_and_packs_the_small_files(tmp_path):
    """scripts/gpu_studies.sh watch: one line per study, `<method>/<seed>:<env steps>(<successful
    steps>)` per cell from its metrics.jsonl, and a tarball in $OUT without checkpoints (what came back
    from the H100); runs with no GPU too (nvidia-smi's absence costs one line)."""
    runs, out = tmp_path / "gpu_runs", tmp_path / "out"
    out.mkdir()
    cell = runs / "grid" / "cells" / "POAD__seed=1"
    (cell / "checkpoints" / "2").mkdir(parents=True)
    (cell / "checkpoints" / "2" / "state").write_bytes(b"x")
    (cell / "metrics.jsonl").write_text("".join(json.dumps({"update": u, "env_steps": 128 * u,
                                                            "steps_succeeded": k}) + "\n"
                                                for u, k in ((1, 0), (2, 2), (3, 1))))
    (runs / "grid" / "cells" / "NTPO__seed=0").mkdir()
    prior = runs / "grid" / "cells" / "TWOSOME__seed=0"  # a prior cell from docs/results/raw: its log gzipped
    prior.mkdir()
    (prior / "metrics.jsonl.gz").write_bytes(gzip.compress(
        b"".join(json.dumps({"update": u, "env_steps": 128 * u, "steps_succeeded": 1}).encode() + b"\n" for u in (1, 2))))
    done = subprocess.run(["bash", str(REPO / "scripts" / "gpu_studies.sh"), "watch", "0"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RUNS": str(runs), "OUT": str(out)})
    assert done.returncode == 0, done.stderr
    assert "grid NTPO/0:0(0) POAD/1:384(3) TWOSOME/0:256(2)" in done.stdout
    import tarfile
    with tarfile.open(out / "gpu_runs.tgz") as packed:
        names = packed.getnames()
    assert "gpu_runs/grid/cells/POAD__seed=1/metrics.jsonl" in names
    assert not [name for name in names if "checkpoints" in name]


def test_the_gpu_script_places_prior_cells_where_a_study_reuses_them(tmp_path):
    """scripts/gpu_studies.sh start --prior=STUDY=DIR,DIR: each dir's cells land in $RUNS/<study>/cells, where
    `find_reusable` finds them for a sibling study's equal configs (study C reusing B's seeds); without
    --study nothing is launched, and study options without --study are one line."""
    runs = tmp_path / "gpu_runs"
    sources = []
    for seed in (0, 1):
        cell = tmp_path / f"pass{seed}" / f"POAD__seed={seed}"
        cell.mkdir(parents=True)
        (cell / "metrics.jsonl").write_text("{}\n")
        sources.append(str(cell.parent))
    done = subprocess.run(["bash", str(REPO / "scripts" / "gpu_studies.sh"), "start", "--prior=grid=" + ",".join(sources)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "RUNS": str(runs)})
    assert done.returncode == 0, done.stderr
    assert "prior cells of grid: 2" in done.stdout and "started" not in done.stdout
    assert sorted(p.name for p in (runs / "grid" / "cells").iterdir()) == ["POAD__seed=0", "POAD__seed=1"]
    bad = subprocess.run(["bash", str(REPO / "scripts" / "gpu_studies.sh"), "start", "--seeds=1"],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "RUNS": str(runs)})
    assert bad.returncode == 2 and bad.stderr.strip() == "start: give --study=studies/<name>.py"


def test_a_finished_cell_recorded_before_a_config_field_existed_is_reused_at_that_fields_default(tmp_path):
    """A cell's config.json written by an older trainer lacks later fields (`mesh`, `distributed`): it ran as
    their defaults, so it matches a cell at the defaults and not one that sets such a field otherwise."""
    study = spec.load_study(write_study(tmp_path, updates=1, methods=("poad",), seeds=(0,)))
    config = spec.cell_config(study, spec.grid(study)[0])
    old_cell = tmp_path / "runs" / "older" / "cells" / "POAD__seed=0"
    recorded = json.loads(config.to_json_best_effort())
    assert recorded["mesh"] == {"data": 1, "fsdp": 1, "tensor": 1}
    del recorded["mesh"], recorded["distributed"]
    _fake_cell(old_cell.parent.parent, old_cell.name, [{"update": 1, "env_steps": 16}], "done")
    scheduler.write_json_atomic(old_cell / "config.json", recorded)
    workdir = tmp_path / "runs" / "newer"
    assert scheduler.find_reusable(workdir, config, 16) == old_cell
    config.mesh.fsdp = 2
    assert scheduler.find_reusable(workdir, config, 16) is None
    config.mesh.fsdp = 1
    config.seed = 1  # a field the old cell did record, set otherwise
    assert scheduler.find_reusable(workdir, config, 16) is None


def test_a_cell_recorded_before_an_env_option_existed_is_reused_at_the_options_default(tmp_path):
    """A config file that now writes out an env option at the env's own default (DataSciCoding's
    `improve_attempts=0`, so that a flag can set it) is the computation an older cell ran without it."""
    study = spec.load_study(write_study(tmp_path, updates=1, methods=("poad",), seeds=(0,)))
    config = spec.cell_config(study, spec.grid(study)[0])
    defaults = scheduler._env_defaults(config.env.name)
    option = next(k for k, v in config.env.kwargs.items() if k in defaults and defaults[k] == v)  # toy: horizon 2
    recorded = json.loads(config.to_json_best_effort())
    del recorded["env"]["kwargs"][option]  # the older cell's config file did not write it out
    cell = tmp_path / "runs" / "older" / "cells" / "POAD__seed=0"
    _fake_cell(cell.parent.parent, cell.name, [{"update": 1, "env_steps": 16}], "done")
    scheduler.write_json_atomic(cell / "config.json", recorded)
    workdir = tmp_path / "runs" / "newer"
    assert scheduler.find_reusable(workdir, config, 16) == cell
    config.env.kwargs[option] = defaults[option] + 1
    assert scheduler.find_reusable(workdir, config, 16) is None


def test_a_cell_recorded_with_what_auto_resolved_to_is_reused_where_auto_resolves_the_same(tmp_path, monkeypatch):
    """A trainer records `matmul_dtype` and `behaviour_logprobs` as "auto" resolved on its machine: a
    sibling cell that recorded bfloat16 / recompute is this config's where "auto" resolves so (a CPU with
    native bfloat16) and not where it resolves to float32; a cell recorded as written still matches."""
    study = spec.load_study(write_study(tmp_path, updates=1, methods=("poad",), seeds=(0,)))
    config = spec.cell_config(study, spec.grid(study)[0])
    config.matmul_dtype, config.behaviour_logprobs = "auto", "auto"
    cell = tmp_path / "runs" / "earlier" / "cells" / "POAD__seed=0"
    _fake_cell(cell.parent.parent, cell.name, [{"update": 1, "env_steps": 16}], "done")
    recorded = json.loads(config.to_json_best_effort())
    scheduler.write_json_atomic(cell / "config.json", {**recorded, "matmul_dtype": "bfloat16",
                                                       "behaviour_logprobs": "recompute"})
    workdir = tmp_path / "runs" / "later"
    monkeypatch.setattr(hardware, "machine_matmul_dtype", lambda: ("bfloat16", "native here"))
    assert scheduler.find_reusable(workdir, config, 16) == cell
    assert config.matmul_dtype == "auto"  # the caller's config is left as written
    monkeypatch.setattr(hardware, "machine_matmul_dtype", lambda: ("float32", "not native here"))
    assert scheduler.find_reusable(workdir, config, 16) is None
    scheduler.write_json_atomic(cell / "config.json", recorded)
    assert scheduler.find_reusable(workdir, config, 16) == cell


def test_a_study_may_pin_a_setting_at_the_value_its_cells_ran_with_but_not_change_it(tmp_path):
    """A cell's directory refuses other settings; a setting the study file now writes out (a base config's
    former default, pinned when the default moved) is no change where the cell's config.json holds that
    very value, and is one where it holds another or where the cell recorded the setting itself."""
    study = spec.load_study(write_study(tmp_path, updates=1, methods=("poad",), seeds=(0,)))
    cell = spec.grid(study)[0]
    workdir = tmp_path / "runs"
    _fake_cell(workdir, cell.name, [{"update": 1, "env_steps": 16}], "done")
    cell_dir = workdir / "cells" / cell.name
    scheduler.write_json_atomic(cell_dir / "cell.json", {"status": "done", "overrides": dict(cell.overrides)})
    ran = json.loads(spec.cell_config(study, cell).to_json_best_effort())
    scheduler.write_json_atomic(cell_dir / "config.json", ran)
    scheduler.check_workdir(study, workdir, [cell])

    def pinned(field, value):
        return dataclasses.replace(cell, overrides={**cell.overrides, field: value})

    scheduler.check_workdir(study, workdir, [pinned("ppo.lambda_scope", ran["ppo"]["lambda_scope"])])
    other = "action" if ran["ppo"]["lambda_scope"] == "token" else "token"
    with pytest.raises(spec.StudyError, match=re.escape(f"was run with other settings (ppo.lambda_scope: None -> "
                                                        f"{other!r})")):
        scheduler.check_workdir(study, workdir, [pinned("ppo.lambda_scope", other)])
    with pytest.raises(spec.StudyError, match="was run with other settings"):
        scheduler.check_workdir(study, workdir, [pinned("ppo.no_such_setting", 1)])
    recorded = {**cell.overrides, "ppo.clip": 0.2}
    scheduler.write_json_atomic(cell_dir / "cell.json", {"status": "done", "overrides": recorded})
    with pytest.raises(spec.StudyError, match=re.escape("ppo.clip: 0.2 -> 0.3")):
        scheduler.check_workdir(study, workdir, [pinned("ppo.clip", 0.3)])


def test_a_cell_linked_from_a_sibling_study_is_checked_by_the_config_it_ran_not_by_that_studys_overrides(tmp_path):
    """A reused cell's cell.json holds its own study's overrides (there, a setting that was not yet the base
    config's default): the workdir accepts it while its config.json is this cell's config, and refuses it,
    naming the link, once it is not."""
    study = spec.load_study(write_study(tmp_path, updates=1, methods=("poad",), seeds=(0,)))
    cell = spec.grid(study)[0]
    ran = json.loads(spec.cell_config(study, cell).to_json_best_effort())
    sibling = tmp_path / "runs" / "earlier"
    _fake_cell(sibling, cell.name, [{"update": 1, "env_steps": 16}], "done")
    source = sibling / "cells" / cell.name
    scheduler.write_json_atomic(source / "cell.json", {"status": "done", "overrides": {
        **cell.overrides, "ppo.clip_eps": ran["ppo"]["clip_eps"]}})
    scheduler.write_json_atomic(source / "config.json", ran)
    workdir = tmp_path / "runs" / "later"
    (workdir / "cells").mkdir(parents=True)
    (workdir / "cells" / cell.name).symlink_to(os.path.relpath(source, workdir / "cells"), target_is_directory=True)
    scheduler.check_workdir(study, workdir, [cell])
    other = {**ran, "ppo": {**ran["ppo"], "clip_eps": ran["ppo"]["clip_eps"] + 0.1}}
    scheduler.write_json_atomic(source / "config.json", other)
    with pytest.raises(spec.StudyError, match=re.escape(f"cell {cell.name} in {workdir} is linked to ../../earlier")):
        scheduler.check_workdir(study, workdir, [cell])


@pytest.mark.long
def test_a_first_pass_trains_every_cell_up_to_n_env_steps_and_a_rerun_continues_them(tmp_path):
    """`--up-to`: every cell stops at that many env steps (seed-major, so every method's first
    steps come early); the same command without it continues each cell, not from scratch."""
    study_file = write_study(tmp_path, name="staged", updates=2, methods=("poad", "twosome"), seeds=(0,))
    workdir = tmp_path / "w"
    first = run_cli(f"--study={study_file}", f"--workdir={workdir}", "--up-to=16")
    assert first.returncode == 0, first.stderr[-2000:]
    cells = sorted((workdir / "cells").iterdir())
    assert len(cells) == 2 and all(not c.is_symlink() for c in cells)
    passes = {}
    for cell in cells:
        records = scheduler.read_records(cell)
        assert [r["env_steps"] for r in records] == [16]
        passes[cell.name] = json.loads((cell / "cell.json").read_text())
        assert passes[cell.name]["seconds_total"] == passes[cell.name]["seconds"] > 0
    second = run_cli(f"--study={study_file}", f"--workdir={workdir}")
    assert second.returncode == 0, second.stderr[-2000:]
    for cell in cells:
        records = scheduler.read_records(cell)
        assert [r["env_steps"] for r in records] == [16, 32]  # continued: update 1 kept, update 2 added
        assert scheduler.cell_finished(cell, 32)
        state = json.loads((cell / "cell.json").read_text())  # the wall time of both passes together
        assert state["seconds_total"] == pytest.approx(passes[cell.name]["seconds_total"] + state["seconds"], abs=0.11)
        assert scheduler.cell_seconds(cell) == state["seconds_total"]
    bad = run_cli(f"--study={study_file}", f"--workdir={workdir}", "--up-to=0")
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --up-to must be >= 1 env step, got 0"
    bad = run_cli(f"--study={study_file}", f"--workdir={workdir}", "--finish-within=0")
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --finish-within must be > 0 minutes, got 0"


def test_a_trainer_killed_by_sigkill_is_reported_as_killed_by_the_system_and_a_rerun_resumes_it(tmp_path):
    """The kernel's OOM killer ends a trainer with SIGKILL and no word of its own: the runner says so in one
    line naming the cell's last checkpoint, records it in cell.json, and a re-run resumes the cell there."""
    study_file = write_study(tmp_path, name="oom", updates=6, methods=("poad",), seeds=(0,))
    workdir = tmp_path / "runs" / "oom"
    cell_dir = workdir / "cells" / "POAD__seed=0"
    runner = subprocess.Popen([sys.executable, "-m", "poad_jax.study", f"--study={study_file}",
                               f"--workdir={workdir}"], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while not (cell_dir / "checkpoints" / "2").is_dir():  # the second update's checkpoint
        assert runner.poll() is None and time.monotonic() < deadline, "no checkpoint before the runner ended"
        time.sleep(0.1)
    (trainer,) = trainer_pids(cell_dir)
    os.kill(trainer, signal.SIGKILL)  # what the OOM killer sends
    output, _ = runner.communicate(timeout=120)
    assert runner.returncode == 0, output[-2000:]
    (line,) = [line for line in output.splitlines() if "killed by the system" in line]
    last = scheduler.checkpoint_lib.checkpoint_steps(cell_dir)[-1]
    assert line == (f"cell POAD__seed=0 was killed by the system (SIGKILL), likely out of memory: its last "
                    f"checkpoint is update {last} ({cell_dir / 'checkpoints' / str(last)}); re-run the same "
                    f"command to resume it, with fewer --workers or beside fewer other processes "
                    f"(log: {cell_dir / 'train.log'})")
    cell = json.loads((cell_dir / "cell.json").read_text())
    assert (cell["status"], cell["returncode"], cell["killed"]) == ("failed", -signal.SIGKILL, "SIGKILL")
    assert "1 cell(s) failed: POAD__seed=0" in output

    result = run_cli(f"--study={study_file}", f"--workdir={workdir}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "killed by the system" not in result.stdout
    assert "resuming" in (cell_dir / "train.log").read_text()
    records = [json.loads(line) for line in (cell_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in records] == [1, 2, 3, 4, 5, 6]
    cell = json.loads((cell_dir / "cell.json").read_text())
    assert cell["status"] == "done" and "killed" not in cell


def _timed_cell(workdir: pathlib.Path, cell: spec.Cell, env_steps: int, status: str, **seconds: float) -> None:
    """A cell directory as the runner leaves it: metrics up to `env_steps`, cell.json with its overrides,
    status and wall time (`seconds`, `seconds_total`)."""
    _fake_cell(workdir, cell.name, [{"update": 1, "env_steps": env_steps}], status)
    scheduler.write_json_atomic(workdir / "cells" / cell.name / "cell.json",
                                {"status": status, "overrides": dict(cell.overrides), **seconds})


def test_a_cells_expected_time_is_its_groups_median_else_the_longest_scaled_by_what_is_left(tmp_path):
    """T = median of the group's finished cells (else the longest finished cell of any group) x (1 - logged
    env steps / total); a cell.json of an older runner gives `seconds`; nothing finished gives None."""
    study = spec.load_study(write_study(tmp_path, updates=2, methods=("poad", "ntpo", "twosome"), seeds=(0, 1, 2)))
    cells = {cell.name: cell for cell in spec.grid(study)}
    workdir = tmp_path / "runs"
    (workdir / "cells").mkdir(parents=True)
    assert scheduler.expected_seconds(workdir, "POAD__seed=2", 32) is None
    _timed_cell(workdir, cells["POAD__seed=0"], 32, "done", seconds=100.0, seconds_total=300.0)
    _timed_cell(workdir, cells["POAD__seed=1"], 32, "done", seconds=500.0)  # written before seconds_total
    _timed_cell(workdir, cells["NTPO__seed=0"], 32, "done", seconds_total=900.0)
    _timed_cell(workdir, cells["NTPO__seed=1"], 8, "failed", seconds=5000.0)  # not finished: no time
    assert scheduler.expected_seconds(workdir, "POAD__seed=2", 32) == pytest.approx(np.median([300.0, 500.0]))
    assert scheduler.expected_seconds(workdir, "NTPO__seed=2", 32) == pytest.approx(900.0)
    assert scheduler.expected_seconds(workdir, "NTPO__seed=1", 32) == pytest.approx(900.0 * (1 - 8 / 32))
    assert scheduler.expected_seconds(workdir, "TWOSOME__seed=0", 32) == pytest.approx(900.0)  # the longest


def test_finish_within_starts_only_the_cells_that_should_finish_in_time(tmp_path):
    """`run_study(finish_within=...)`: a cell whose expected time exceeds what is left is not started (no
    directory, status "not started", a line that says why); the CLI's --finish-within says which in one line."""
    study_file = write_study(tmp_path, updates=2, methods=("poad", "ntpo"), seeds=(0, 1))
    study = spec.load_study(study_file)
    cells = {cell.name: cell for cell in spec.grid(study)}
    workdir = tmp_path / "runs" / "toy_grid"
    (workdir / "cells").mkdir(parents=True)
    for name in ("POAD__seed=0", "NTPO__seed=0"):
        _timed_cell(workdir, cells[name], 32, "done", seconds_total=7200.0)
    lines = []
    status = scheduler.run_study(study, workdir, log=lines.append, finish_within=600.0)
    assert status == {"POAD__seed=0": "done", "NTPO__seed=0": "done", "POAD__seed=1": "not started",
                      "NTPO__seed=1": "not started"}
    assert not (workdir / "cells" / "POAD__seed=1").exists() and not (workdir / "cells" / "NTPO__seed=1").exists()
    assert any(line.startswith("[toy_grid] cell POAD__seed=1 not started: it should take about 2h00m and ")
               and line.endswith("is left of --finish-within") for line in lines), lines
    assert "2 not started (would not finish in time)" in lines[-1]
    result = run_cli(f"--study={study_file}", f"--workdir={workdir}", "--finish-within=10")
    assert result.returncode == 0, result.stderr[-2000:]
    assert ("2 cell(s) not started, as they would not finish within --finish-within: POAD__seed=1, NTPO__seed=1; "
            "run them later") in result.stdout
    bad = run_cli(f"--study={study_file}", f"--workdir={workdir}", "--report", "--finish-within=10")
    assert bad.returncode == 2 and "--report runs nothing" in bad.stderr


def test_a_study_file_naming_the_theory_module_where_it_was_still_reports():
    """Study files written before the package's layers name `poad_jax.theory`; it is `poad_jax.tools.theory` now."""
    old = tables._theory_fn("poad_jax.theory:save_or_take_optimum")
    assert old is tables._theory_fn("poad_jax.tools.theory:save_or_take_optimum") is not None


@pytest.mark.long
def test_seeds_runs_only_those_seeds_and_a_later_run_adds_the_rest(tmp_path):
    study_file = write_study(tmp_path, name="by_seed", updates=1, methods=("poad",), seeds=(0, 1))
    workdir = tmp_path / "runs" / "by_seed"
    one_line_error(run_cli(f"--study={study_file}", f"--workdir={workdir}", "--seeds=2"), "has seeds 0,1")
    one_line_error(run_cli(f"--study={study_file}", f"--workdir={workdir}", "--seeds=one"), "whole numbers")
    result = run_cli(f"--study={study_file}", f"--workdir={workdir}", "--seeds=1")
    assert result.returncode == 0, result.stderr[-2000:]
    finished = sorted(p.parent.name for p in (workdir / "cells").glob("*/finished.json"))
    assert finished == ["POAD__seed=1"]
    recorded = json.loads((workdir / "study.json").read_text())
    assert [cell["seed"] for cell in recorded["cells"]] == [0, 1]  # the study is still the whole study
    result = run_cli(f"--study={study_file}", f"--workdir={workdir}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "cells: 1 done" in result.stdout.splitlines()[0]  # seed 1 kept, only seed 0 trained
    finished = sorted(p.parent.name for p in (workdir / "cells").glob("*/finished.json"))
    assert finished == ["POAD__seed=0", "POAD__seed=1"]


@pytest.mark.long
def test_cells_runs_only_the_cells_it_names_and_an_unknown_label_is_one_line(tmp_path):
    """`--cells` narrows a pass as `--seeds` does: with both, the cells in both, so a pass of two cells
    trains those two and no other; the study recorded is still the whole study."""
    study_file = write_study(tmp_path, name="by_cell", updates=1, methods=("poad", "ntpo", "twosome"), seeds=(0, 1))
    workdir = tmp_path / "runs" / "by_cell"
    one_line_error(run_cli(f"--study={study_file}", f"--workdir={workdir}", "--cells=PAOD"),
                   "--cells 'PAOD': study 'by_cell' has the cells of 'POAD'; 'NTPO'; 'TWOSOME'")
    one_line_error(run_cli(f"--study={study_file}", f"--workdir={workdir}", "--cells=POAD__seed=0", "--seeds=1"),
                   "no cell of --cells=POAD__seed=0 has a seed of --seeds=1")
    one_line_error(run_cli(f"--study={study_file}", f"--workdir={workdir}", "--cells=POAD", "--report"),
                   "drop --cells")
    result = run_cli(f"--study={study_file}", f"--workdir={workdir}", "--cells=NTPO,TWOSOME__seed=1", "--seeds=1")
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(p.name for p in (workdir / "cells").iterdir()) == ["NTPO__seed=1", "TWOSOME__seed=1"]
    assert all((workdir / "cells" / name / "finished.json").is_file() for name in ("NTPO__seed=1", "TWOSOME__seed=1"))
    recorded = json.loads((workdir / "study.json").read_text())
    assert len(recorded["cells"]) == 6  # the study is still the whole study


def test_cells_labelled_reads_group_labels_with_commas_and_cell_names():
    """A group label of a two-axis study holds a comma (`action_length=2, POAD`): read as one label."""
    study = spec.load_study(REPO / "studies" / "action_length.py")
    names = spec.cells_labelled(study, "action_length=2, POAD,action_length=16__TWOSOME__seed=3")
    assert names == tuple(f"action_length=2__POAD__seed={s}" for s in study.seeds) + ("action_length=16__TWOSOME__seed=3",)
    assert spec.cells_labelled(study, "action_length=16__TWOSOME") == tuple(
        f"action_length=16__TWOSOME__seed={s}" for s in study.seeds)
    assert len(spec.cells_labelled(study, "action_length=16")) == 3 * len(study.seeds)  # one axis's value
    with pytest.raises(spec.StudyError, match="^--cells 'NTPO': study 'action_length' has the cells of 'action_length=2, POAD'; "):
        spec.cells_labelled(study, "NTPO")


FAKE_EVALUATE = """#!/usr/bin/env bash
# Stands in for python: records each call and writes the table file `evaluate` writes for its --policy, or
# the report scripts/behaviour_gap.py writes into its --out.
echo "$*" >> "$CALLS"
for arg in "$@"; do case $arg in --workdir=*) workdir=${arg#*=} ;; --policy=*) policy=${arg#*=} ;; esac; done
case $1 in  # scripts/behaviour_gap.py --workdir=CELL ... --out=CELL
  */behaviour_gap.py) printf '# gap\\n\\n20 episodes of mu. More\\n' > "${workdir%/}/behaviour_gap.md"; exit ;;
esac
[ "$policy" = "${FAIL_POLICY:-}" ] && exit 1
table=evaluation.txt; [ "$policy" = token ] && table=evaluation_token.txt
printf '# command\\nheader\\nrow %s\\n' "$policy" > "$workdir/$table"
"""


def stand_in_python(directory: pathlib.Path) -> pathlib.Path:
    """An executable `FAKE_EVALUATE` in `directory`, for the runner's PYTHON."""
    fake = directory / "python"
    fake.write_text(FAKE_EVALUATE)
    fake.chmod(0o755)
    return fake


def test_evaluating_a_studys_cells_plays_the_token_policy_and_poads_behaviour_once(tmp_path):
    """scripts/evaluate_cells.sh WORKDIR: each finished cell with checkpoints gets its token policy
    played (evaluation_token.txt) and, except TWOSOME's (its behaviour is its token policy), its behaviour
    (evaluation.txt); a cell already evaluated, unfinished or without checkpoints is left alone."""
    runs, calls, fake = tmp_path / "studies", tmp_path / "calls.txt", stand_in_python(tmp_path)
    cells = runs / "virtualhome_compare" / "cells"
    for name, method, sampling, finished in (("POAD__seed=3", "poad", "action_scores", True),
                                             ("POAD-trie__seed=3", "poad", "trie", True),
                                             ("TWOSOME__seed=3", "twosome", "trie", True),
                                             ("NTPO__seed=3", "ntpo", "action_scores", False)):
        (cells / name / "checkpoints").mkdir(parents=True)
        (cells / name / "config.json").write_text(json.dumps({"method": method, "restricted_sampling": sampling},
                                                             indent=2))
        if finished:
            (cells / name / "finished.json").write_text("{}")
    environment = {**os.environ, "PYTHON": str(fake), "CALLS": str(calls)}
    passes = []
    for _ in range(2):  # the second pass finds every table and plays nothing
        passes.append(subprocess.run(["bash", str(REPO / "scripts" / "evaluate_cells.sh"), str(runs / "virtualhome_compare")],
                                     capture_output=True, text=True, timeout=120, env=environment))
        assert passes[-1].returncode == 0, passes[-1].stderr
    lines = calls.read_text().splitlines()
    played = sorted(re.search(r"cells/(\S+?)/? --policy=(\w+)", line).groups() for line in lines if "--policy" in line)
    assert played == [("POAD-trie__seed=3", "behaviour"), ("POAD-trie__seed=3", "token"),
                      ("POAD__seed=3", "behaviour"), ("POAD__seed=3", "token"), ("TWOSOME__seed=3", "token")]
    gaps = [re.search(r"cells/(\S+?)/? ", line).group(1) for line in lines if "behaviour_gap.py" in line]
    assert gaps == ["POAD__seed=3"]  # the one finished cell that sampled from the action scores, once
    assert "POAD__seed=3 behaviour gap: 20 episodes of mu\n" in passes[0].stdout
    assert "gap" not in passes[1].stdout
    assert (cells / "POAD__seed=3" / "behaviour_gap.md").exists()
    assert (cells / "POAD__seed=3" / "evaluation.txt").read_text().splitlines()[-1] == "row behaviour"
    assert not (cells / "TWOSOME__seed=3" / "evaluation.txt").exists()
    assert not list((cells / "NTPO__seed=3").glob("evaluation*"))


def test_evaluating_a_studys_cells_tries_a_failed_evaluation_once_a_pass_and_says_so(tmp_path):
    """A failing evaluation is played once, not in each of the script's two passes: its log is named and the
    script fails; a call without a workdir says how to call it."""
    runs, calls, fake = tmp_path / "studies", tmp_path / "calls.txt", stand_in_python(tmp_path)
    cell = runs / "virtualhome_compare" / "cells" / "POAD__seed=3"
    (cell / "checkpoints").mkdir(parents=True)
    (cell / "config.json").write_text(json.dumps({"method": "poad"}, indent=2))
    (cell / "finished.json").write_text("{}")
    done = subprocess.run(["bash", str(REPO / "scripts" / "evaluate_cells.sh"), str(runs / "virtualhome_compare")],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHON": str(fake), "CALLS": str(calls), "FAIL_POLICY": "behaviour"})
    assert done.returncode != 0
    assert [re.search(r"--policy=(\w+)", line).group(1) for line in calls.read_text().splitlines()] == [
        "token", "behaviour"]
    assert "POAD__seed=3 behaviour: evaluation failed, see" in done.stderr and "evaluate_behaviour.log" in done.stderr
    assert (cell / "evaluation_token.txt").exists() and not (cell / "evaluation.txt").exists()
    usage = subprocess.run(["bash", str(REPO / "scripts" / "evaluate_cells.sh")], capture_output=True, text=True,
                           timeout=60)
    assert usage.returncode != 0 and "bash scripts/evaluate_cells.sh WORKDIR [EPISODES]" in usage.stdout


def test_the_runner_names_cells_whose_settings_zero_every_advantage():
    """Study A's TWOSOME cells at 4 x 8 steps with the preset's 8 loss chunks (one row per chunk: step 1's,
    the ladder's rung 2) are named before they run; its POAD cells, and step 3's TWOSOME cells with two
    loss chunks, are not."""
    step1 = spec.load_study(REPO / "studies" / "virtualhome_preset_8steps.py")
    cells = spec.grid(step1)
    lines = scheduler.cell_warnings(step1, cells, {c.name: spec.cell_config(step1, c) for c in cells})
    assert [line.split(": ")[0] for line in lines] == [
        f"[virtualhome_preset_8steps] cell TWOSOME__seed={seed}" for seed in step1.seeds]
    assert all("every TWOSOME advantage will be 0" in line for line in lines)
    ladder = spec.load_study(REPO / "studies" / "virtualhome_preset_ladder.py")
    cells = spec.grid(ladder)
    lines = scheduler.cell_warnings(ladder, cells, {c.name: spec.cell_config(ladder, c) for c in cells})
    assert [line.split(": ")[0] for line in lines] == [
        f"[virtualhome_preset_ladder] cell TWOSOME-2-lr-1e-4__seed={seed}" for seed in ladder.seeds]
