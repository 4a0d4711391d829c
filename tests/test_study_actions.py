"""The study report's section on what the policies wrote (`poad_jax/tools/study/actions.py`), from the
cells' `actions.jsonl`: error names as a traceback ends, the first and last parts of a cell's env
steps counted by hand, one example of each outcome per part, and nothing without a log."""

from __future__ import annotations

import json
import pathlib

import numpy as np

from poad_jax.tools.study import actions, report, spec

REPO = pathlib.Path(__file__).resolve().parents[1]


def write_study(directory: pathlib.Path, seeds: tuple[int, ...] = (0,), **report: object) -> pathlib.Path:
    """A DataSciCoding-like study file of POAD and NTPO on the toy config; `report` adds report options."""
    options = {"metric": "step_reward_mean", "smoothing": 1, "final_fraction": 0.25,
               "steps": {"succeeded": "runnable", "reward": "AUC"}, **report}
    path = directory / "datasci_like.py"
    path.write_text(f'''
def get_study():
    return {{
        "name": "datasci_like",
        "base_config": "{REPO / 'configs' / 'toy.py'}",
        "fixed": {{"total_env_steps": 64, "tensorboard": False, "plot": False}},
        "axes": {{"variant": [{{"label": "POAD", "method": "poad"}}, {{"label": "NTPO", "method": "ntpo"}}]}},
        "seeds": {seeds!r},
        "report": {options!r},
    }}
''')
    return path


def test_error_kind_is_the_exception_a_traceback_ends_with():
    traceback = 'Traceback (most recent call last):\n  File "x.py", line 3\nKeyError: 3\n\nValueError: bad shape'
    assert actions.error_kind(traceback) == "ValueError"
    assert actions.error_kind("TimeoutError: the code ran longer than 30 s") == "TimeoutError"
    assert actions.error_kind("the process was killed without a result") == "the process was killed without a result"
    assert actions.error_kind(None) == "" and actions.error_kind("") == ""


def test_the_section_counts_each_part_by_hand_and_shows_one_example_of_each_outcome(tmp_path):
    study = spec.load_study(write_study(tmp_path))
    workdir = tmp_path / "runs"
    rng = np.random.default_rng(7)
    lines = []
    for step in range(1, 65):
        ran = bool(rng.uniform() < (0.8 if step <= 16 else 0.3))
        estimator = ["RandomForestClassifier", "SVC", "LogisticRegression"][step % 3 if step <= 32 else 0]
        info = {"success": ran, "program": f"from sklearn.svm import SVC\nfrom sklearn.ensemble import "
                f"RandomForestClassifier\nfrom sklearn.linear_model import LogisticRegression\n"
                f"def build_model(x, y):\n    return {estimator}().fit(x, y)"}
        if not ran:
            info["error"] = ["NameError: name 'LR' is not defined", "Traceback\nKeyError: 0",
                             "TimeoutError: slow"][step % 3]
        lines.append({"update": (step - 1) // 8 + 1, "env_step": step, "thread": (step - 1) % 8,
                      "action": "```python\n" + info["program"] + "\n```", "done": ran,
                      "reward": float(rng.uniform(0.6, 0.9)) if ran else -1.0, "info": info})
    cell = workdir / "cells" / "POAD__seed=0"
    cell.mkdir(parents=True)
    rng.shuffle(lines)  # the log's order is not the env steps' (threads of a resumed run): windows sort
    (cell / "actions.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (workdir / "cells" / "NTPO__seed=0").mkdir(parents=True)  # a cell without a log: no row
    section = actions.actions_section(study, workdir, 0.25)
    rows = [row for row in section if row.startswith("| POAD__seed=0 |")]
    assert len(rows) == 2 and not any(row.startswith("| NTPO") for row in section)
    for row, span in zip(rows, (range(1, 17), range(49, 65))):
        part = sorted((line for line in lines if line["env_step"] in span), key=lambda line: line["env_step"])
        ran = [line for line in part if line["info"]["success"]]
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2] == f"{span[0]:,}-{span[-1]:,}" and cells[3] == f"{len(ran)} of 16"
        assert cells[4] == f"{np.mean([line['reward'] for line in ran]):.3f}"
        failed = [actions.error_kind(line["info"]["error"]) for line in part if not line["info"]["success"]]
        top = max(set(failed), key=lambda name: (failed.count(name), -failed.index(name)))
        assert cells[5].startswith(f"{top} ({failed.count(top)})")
        assert cells[6] == f"{np.mean([len(line['action']) for line in part]):.0f}"
        estimators = [line["info"]["program"].split("return ")[1].split("(")[0] for line in ran]
        assert cells[7] == ", ".join(f"{name} ({estimators.count(name)})"
                                     for name in sorted(set(estimators), key=lambda n: (-estimators.count(n),
                                                                                       estimators.index(n)))[:3])
    first_ok = min(line["env_step"] for line in lines if line["env_step"] <= 16 and line["info"]["success"])
    assert any(row.startswith(f"env step {first_ok} (update {(first_ok - 1) // 8 + 1}), reward ") for row in section)
    assert sum(row.startswith("```python") for row in section) == 4  # ran and failed, in each part
    (cell / "metrics.jsonl").write_text(json.dumps({"update": 8, "env_steps": 64, "episode_return": 0.0}) + "\n")
    (cell / "cell.json").write_text(json.dumps({"status": "done"}))
    written = report.write_report(study, workdir).read_text()
    assert "What the policies wrote" in written and rows[0] in written


def test_no_classes_column_for_actions_without_programs(tmp_path):
    """Actions that are not programs (VirtualHome's) leave the classes column out."""
    study = spec.load_study(write_study(tmp_path))
    cell = tmp_path / "runs" / "cells" / "POAD__seed=0"
    cell.mkdir(parents=True)
    lines = [{"update": 1, "env_step": step, "thread": 0, "action": "walk to the kitchen", "reward": 0.0,
              "done": False, "info": {"success": step % 2 == 0}} for step in range(1, 9)]
    (cell / "actions.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    section = actions.actions_section(study, tmp_path / "runs", 0.25)
    header = next(row for row in section if row.startswith("| cell | part |"))
    assert header.count("|") == 8 and "classes" not in header
    assert all(row.count("|") == 8 for row in section if row.startswith("| POAD__seed=0 |"))


def test_no_section_without_a_log(tmp_path):
    study = spec.load_study(write_study(tmp_path))
    (tmp_path / "runs" / "cells" / "POAD__seed=0").mkdir(parents=True)
    assert actions.actions_section(study, tmp_path / "runs", 0.25) == []


def test_a_programs_score_is_its_auc_where_the_env_reports_one_not_an_improvement_attempts_gain():
    """In an improvement episode a later program earns its gain over the episode's best (0.02 here), so the
    part's mean score of the programs that ran is their AUCs' mean, not their rewards'; without an `auc`
    the reward is the score."""
    first = {"reward": 0.80, "info": {"success": True, "auc": 0.80, "program": "LogisticRegression()"}}
    better = {"reward": 0.02, "info": {"success": True, "auc": 0.82, "program": "SVC(probability=True)"}}
    failed = {"reward": -1.0, "info": {"success": False, "error": "TypeError: bad"}}
    plain = {"reward": 0.5, "info": {"success": True}}
    lines = [{**line, "action": "x"} for line in (first, better, failed)]
    assert actions.step_score(better) == 0.82 and actions.step_score(plain) == 0.5
    row = actions.window_row(lines)
    assert (row["steps"], row["succeeded"]) == (3, 2)
    np.testing.assert_allclose(row["mean_reward"], np.mean([0.80, 0.82]))
