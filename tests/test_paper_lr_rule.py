"""The pre-registered rule of the paper-settings lr sweep (scripts/paper_lr_rule.py) on synthetic cells."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("paper_lr_rule", REPO / "scripts" / "paper_lr_rule.py")
rule = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = rule  # dataclasses look their module up
_spec.loader.exec_module(rule)


def write_cell(workdir: pathlib.Path, rate: str, method: str, kls: list[float], success_at: int | None) -> None:
    """A sweep cell of 128 env steps per update; one success logged at update `success_at`."""
    cell = workdir / "cells" / f"actor_lr={rate}__{method}__seed=0"
    cell.mkdir(parents=True)
    lines = []
    for update, kl in enumerate(kls, start=1):
        total = int(success_at is not None and update >= success_at)
        lines.append(json.dumps({"update": update, "env_steps": 128 * update, "episodes": 2 * update,
                                 "steps_succeeded_total": total, "approx_kl": kl}))
    (cell / "metrics.jsonl").write_text("\n".join(lines) + "\n{cut by a ki")


def test_the_largest_rate_with_a_success_and_a_small_enough_kl_is_chosen(tmp_path, capsys):
    write_cell(tmp_path, "0.0001", "POAD", [0.03, 0.025, 0.01], success_at=2)       # median KL 0.025: out
    write_cell(tmp_path, "0.0001", "TWOSOME", [1e-4] * 3, success_at=1)
    write_cell(tmp_path, "3e-05", "POAD", [0.01, 0.02, 0.03], success_at=None)       # median 0.02: within
    write_cell(tmp_path, "3e-05", "TWOSOME", [1e-4] * 3, success_at=3)              # a success in one cell
    write_cell(tmp_path, "1e-05", "POAD", [1e-3] * 3, success_at=1)
    write_cell(tmp_path, "1e-05", "TWOSOME", [1e-5] * 3, success_at=1)
    assert rule.main(["--workdir", str(tmp_path), "--env-steps", "384"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "chosen: 3e-05" and len(out) == 7


def test_successes_after_the_env_steps_read_do_not_count(tmp_path):
    write_cell(tmp_path, "0.0001", "POAD", [1e-3] * 4, success_at=4)
    cells = rule.read_cells(tmp_path, env_steps=384)
    assert cells[0].successes == 0 and cells[0].env_steps == 384
    assert rule.decide(cells) == ("extend", None)
    assert rule.decide(rule.read_cells(tmp_path, env_steps=512)) == ("chosen", 1e-4)


def test_no_rate_within_the_kl_bound_asks_for_a_lower_rate(tmp_path, capsys):
    write_cell(tmp_path, "0.0001", "POAD", [0.05] * 3, success_at=1)
    write_cell(tmp_path, "3e-05", "POAD", [0.03] * 3, success_at=None)
    assert rule.main(["--workdir", str(tmp_path)]) == 4
    assert capsys.readouterr().out.splitlines()[-1] == "decision: lower"


@pytest.mark.parametrize("kls, successes, expected", [
    ([0.02], 1, ("chosen", 1e-4)),     # the bound is inclusive
    ([0.0200001], 1, ("lower", None)),
    ([0.001], 0, ("extend", None)),
])
def test_decide_at_the_bounds(kls, successes, expected):
    cell = rule.CellSummary(rate=1e-4, method="POAD", env_steps=128, episodes=2, successes=successes,
                            median_kl=kls[0])
    assert rule.decide([cell]) == expected


def test_an_empty_workdir_is_one_line(tmp_path, capsys):
    assert rule.main(["--workdir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")
