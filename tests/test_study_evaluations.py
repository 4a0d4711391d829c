"""A study report's evaluation section (the behaviour and the token policy played at each cell's final
checkpoint, beside the behaviour gap logged in training) and its figure of how the policy moved."""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np

from poad_jax.tools import evaluate
from poad_jax.tools.study import evaluations, figures, report, spec
from test_study_actions import write_study


def saved_table(results: list[evaluate.EvalResult]) -> str:
    """An evaluation table as `evaluate.save_table` writes it."""
    return f"# python -m poad_jax.evaluate --workdir=x  (2026-11-27 00:00:00 UTC)\n{evaluate.format_table(results)}\n"


def test_the_successes_come_back_from_the_saved_table_for_every_count_below_a_hundred():
    for episodes in range(1, 100):
        for successes in range(episodes + 1):
            rate = successes / episodes
            table = saved_table([evaluate.EvalResult("virtualhome/food_preparation", "sampled", episodes,
                                                     rate, rate)])
            assert evaluations.parse_evaluation(table) == (successes, episodes), (successes, episodes)


def test_sampled_rows_are_summed_over_environments_and_greedy_or_empty_rows_left_out():
    table = saved_table([evaluate.EvalResult("a/one", "sampled", 20, 0.3, 0.35),
                         evaluate.EvalResult("a/one", "greedy", 20, 1.0, 1.0),
                         evaluate.EvalResult("b/two", "sampled", 10, 0.1, 0.1),
                         evaluate.EvalResult("c/three", "sampled", 0, math.nan, math.nan)])
    assert evaluations.parse_evaluation(table) == (7 + 1, 30)
    assert evaluations.parse_evaluation(table, mode="greedy") == (20, 20)
    assert evaluations.parse_evaluation(saved_table([evaluate.EvalResult("c", "sampled", 0, 0.0, 0.0)])) is None
    assert evaluations.parse_evaluation("not a table\n") is None
    assert evaluations.parse_evaluation("") is None


def test_quarter_means_are_the_first_and_last_quarter_of_the_updates_that_logged():
    rng = np.random.default_rng(3)
    for logged in (1, 2, 5, 8, 13):
        values = rng.uniform(0, 2, logged)
        records = [{"update": 1, "importance_weight": None}]  # before the key was logged: not counted
        records += [{"update": u + 2, "importance_weight": float(v)} for u, v in enumerate(values)]
        quarter = -(-logged // 4)
        got = evaluations.quarter_means(records, "importance_weight")
        np.testing.assert_allclose(got, (values[:quarter].mean(), values[logged - quarter:].mean()), rtol=1e-12)
    assert all(math.isnan(x) for x in evaluations.quarter_means([{"update": 1}], "importance_weight"))


def fake_cell(workdir: pathlib.Path, name: str, records: list[dict], tables: dict[str, str]) -> pathlib.Path:
    cell = workdir / "cells" / name
    cell.mkdir(parents=True)
    (cell / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (cell / "cell.json").write_text(json.dumps({"status": "done"}))
    for file_name, text in tables.items():
        (cell / file_name).write_text(text)
    return cell


def learner_records(updates: int, rng: np.random.Generator, corrected: bool) -> list[dict]:
    records = []
    for u in range(updates):
        record = {"update": u + 1, "env_steps": 16 * (u + 1), "episodes": u, "episode_return": 0.0,
                  "success_rate": 0.0, "approx_kl": float(rng.uniform(1e-5, 1e-3)),
                  "entropy": 0.5, "explained_variance": float(rng.uniform(-1, 1))}
        if corrected:
            record.update(behaviour_kl_action=float(rng.uniform(0.1, 1.0)),
                          importance_weight=float(rng.uniform(0.9, 1.0)))
        records.append(record)
    return records


def rows_of(lines: list[str], header: str) -> dict[str, list[str]]:
    """The rows, by their first cell, of the table whose header line starts with `header`."""
    split = [[c.strip() for c in line.strip("|").split("|")] if line.startswith("|") else None for line in lines]
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    out = {}
    for cells in split[start + 2:]:
        if cells is None:
            break
        out[cells[0]] = cells
    return out


def test_the_report_gives_each_evaluated_cell_both_policies_and_pools_them_per_group(tmp_path):
    study = spec.load_study(write_study(tmp_path, seeds=(0, 1)))
    workdir = tmp_path / "runs"
    rng = np.random.default_rng(0)
    sampled = lambda k, n: saved_table([evaluate.EvalResult("x/y", "sampled", n, k / n, k / n)])  # noqa: E731
    poad0 = learner_records(8, rng, corrected=True)
    fake_cell(workdir, "POAD__seed=0", poad0,
              {"evaluation.txt": sampled(15, 20), "evaluation_token.txt": sampled(1, 20)})
    fake_cell(workdir, "POAD__seed=1", learner_records(8, rng, corrected=True),
              {"evaluation.txt": sampled(12, 20), "evaluation_token.txt": sampled(3, 20)})
    fake_cell(workdir, "NTPO__seed=0", learner_records(8, rng, corrected=False),
              {"evaluation_token.txt": sampled(9, 10)})
    fake_cell(workdir, "NTPO__seed=1", learner_records(8, rng, corrected=False), {})  # not evaluated: no row
    text = report.write_report(study, workdir).read_text().splitlines()
    cells = rows_of(text, "| cell | behaviour: successes |")
    assert "NTPO__seed=1" not in cells and {"POAD__seed=0", "POAD__seed=1", "NTPO__seed=0"} <= cells.keys()
    low, high = report.wilson_interval(15, 20)
    kl = [r["behaviour_kl_action"] for r in poad0]
    weight = [r["importance_weight"] for r in poad0]
    assert cells["POAD__seed=0"][1:] == [f"15 of 20 ({low:.2f}-{high:.2f})",
                                         "1 of 20 ({:.2f}-{:.2f})".format(*report.wilson_interval(1, 20)),
                                         f"{np.mean(kl[:2]):.2f} -> {np.mean(kl[-2:]):.2f}",
                                         f"{np.mean(weight[:2]):.3f} -> {np.mean(weight[-2:]):.3f}"]
    assert cells["NTPO__seed=0"][1] == "-" and cells["NTPO__seed=0"][3:] == ["-", "-"]
    groups = rows_of(text, "| group | cells evaluated |")
    assert groups["POAD"][1:] == ["2", "27 of 40 ({:.2f}-{:.2f})".format(*report.wilson_interval(27, 40)),
                                  "4 of 40 ({:.2f}-{:.2f})".format(*report.wilson_interval(4, 40))]
    assert groups["NTPO"][1:3] == ["1", "-"]


def test_a_report_without_evaluations_has_no_section_and_without_a_learner_no_dynamics_figure(tmp_path):
    study = spec.load_study(write_study(tmp_path))
    workdir = tmp_path / "runs"
    plain = [{"update": u + 1, "env_steps": 16 * (u + 1), "episodes": u, "episode_return": 0.0, "success_rate": 0.0}
             for u in range(4)]
    fake_cell(workdir, "POAD__seed=0", plain, {})
    text = report.write_report(study, workdir).read_text()
    assert "Evaluation at each cell" not in text and "dynamics.png" not in text
    assert not (workdir / "dynamics.png").exists()
    fake_cell(workdir, "NTPO__seed=0", learner_records(4, np.random.default_rng(1), corrected=False), {})
    text = report.write_report(study, workdir).read_text()
    assert "![dynamics](dynamics.png)" in text and (workdir / "dynamics.png").stat().st_size > 0


def test_the_geometric_band_is_the_band_of_the_logarithms():
    rng = np.random.default_rng(5)
    steps = np.arange(1, 9) * 32.0
    seeds = [rng.uniform(1e-5, 1e-2, len(steps)) for _ in range(3)]
    logs = np.log10(np.array(seeds))
    seeds[1][2] = 0.0  # missing, not log(0): interpolated over in log space, as `band` does with a gap
    logs[1][2] = (logs[1][1] + logs[1][3]) / 2
    got_steps, low, middle, high = figures.geometric_band([(steps, v) for v in seeds], window=1)
    mean, std = logs.mean(axis=0), logs.std(axis=0)
    np.testing.assert_allclose(got_steps, steps)
    np.testing.assert_allclose(middle, 10 ** mean, rtol=1e-12)
    np.testing.assert_allclose(low, 10 ** (mean - std), rtol=1e-12)
    np.testing.assert_allclose(high, 10 ** (mean + std), rtol=1e-12)
    assert np.all(low > 0)


def test_the_dynamics_curves_leave_gaps_where_an_update_did_not_log():
    records = [{"env_steps": 32, "approx_kl": 1e-4}, {"env_steps": 64, "approx_kl": None, "importance_weight": 0.9}]
    curves = figures.dynamics_curves(records)
    np.testing.assert_array_equal(curves["approx_kl"][0], [32, 64])
    assert curves["approx_kl"][1][0] == 1e-4 and math.isnan(curves["approx_kl"][1][1])
    assert math.isnan(curves["importance_weight"][1][0]) and curves["importance_weight"][1][1] == 0.9
    assert np.isnan(curves["behaviour_kl_action"][1]).all()
