"""The study report's section on each DataSciCoding cell's best program (`poad_jax/tools/study/programs.py`):
the scikit-learn classes a program calls, read from its syntax tree; the cells' rows, re-scored in the real
sandbox; the groups' mean, std and highest by hand beside the study's references; a malformed option refused
when the study loads."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

import envs_py
from envs_py.datasci.sandbox import CandidateResult
from poad_jax.run.best_program import BestProgram, write_best
from poad_jax.tools.study import programs, report, spec
from test_study_actions import write_study as study_file

REPO = pathlib.Path(__file__).resolve().parents[1]
ENV = "datasci/balance_scale"
LOGISTIC = ("from sklearn.linear_model import LogisticRegression\n\ndef build_model(x_train, y_train):\n"
            "    return LogisticRegression(max_iter=500).fit(x_train, y_train)\n")
TREE = ("import sklearn.tree as trees\n\ndef build_model(x_train, y_train):\n"
        "    return trees.DecisionTreeClassifier(max_depth=3, random_state=0).fit(x_train, y_train)\n")
BROKEN = "def build_model(x_train, y_train):\n    return no_such_model\n"
REFERENCES = {"POAD-Best (paper)": 0.9651, "CAAFE with GPT-4 (paper)": 0.882}


def write_study(directory: pathlib.Path, option: object) -> pathlib.Path:
    return study_file(directory, seeds=(0, 1), best_programs=option)


def test_the_classes_a_program_calls_in_the_order_it_first_calls_them():
    program = ("import sklearn.ensemble as ens\nfrom sklearn import preprocessing\n"
               "from sklearn.pipeline import make_pipeline\nfrom sklearn.svm import SVC as Machine\n"
               "from sklearn.metrics import roc_auc_score\nimport sklearn\n\n"
               "def build_model(x_train, y_train):\n"
               "    scaler = preprocessing.StandardScaler()\n"
               "    forest = ens.RandomForestClassifier(n_estimators=5)\n"
               "    other = sklearn.linear_model.LogisticRegression()\n"
               "    again = preprocessing.StandardScaler()\n"
               "    return make_pipeline(scaler, Machine(probability=True)).fit(x_train, y_train)\n")
    assert programs.sklearn_classes(program) == ["StandardScaler", "RandomForestClassifier", "LogisticRegression",
                                                 "SVC"]
    assert programs.sklearn_classes(LOGISTIC) == ["LogisticRegression"]
    assert programs.sklearn_classes(TREE) == ["DecisionTreeClassifier"]
    assert programs.sklearn_classes("class Mine:\n    pass\nm = Mine()\n") == []  # not from sklearn
    assert programs.sklearn_classes("def build_model(:\n") == []


def _keep(workdir: pathlib.Path, cell: str, program: str, auc: float, env_step: int, logged: int) -> None:
    directory = workdir / "cells" / cell
    directory.mkdir(parents=True)
    write_best(directory, BestProgram(program=program, mean_auc=auc, auc_per_split=(auc,) * 5, env=ENV,
                                      env_kwargs={}, dataset="balance_scale", update=1, env_steps=env_step))
    (directory / "metrics.jsonl").write_text(json.dumps({"update": 2, "env_steps": logged}) + "\n")


def test_the_section_rescores_each_cell_and_sets_the_groups_beside_the_references(tmp_path):
    study = spec.load_study(write_study(tmp_path, {"rescore": True, "reference": REFERENCES}))
    env = envs_py.make(ENV)
    try:
        true_auc = {name: env.score_program(program) for name, program in (("logistic", LOGISTIC), ("tree", TREE))}
    finally:
        env.close()
    assert all(result.success for result in true_auc.values())
    workdir = tmp_path / "runs"
    _keep(workdir, "POAD__seed=0", LOGISTIC, true_auc["logistic"].mean_auc, 3, 16)
    _keep(workdir, "POAD__seed=1", TREE, true_auc["tree"].mean_auc, 9, 12)
    _keep(workdir, "NTPO__seed=0", BROKEN, 0.75, 5, 16)  # recorded as if it ran: re-running it fails
    (workdir / "cells" / "NTPO__seed=1").mkdir(parents=True)
    (workdir / "cells" / "NTPO__seed=1" / "best_program.json").write_text("{not json")  # damaged: no row
    section = programs.best_programs_section(study, workdir)
    rows = {row.split("|")[1].strip(): [c.strip() for c in row.strip("|").split("|")]
            for row in section if row.startswith("| ")}
    logistic = rows["POAD__seed=0"]
    assert logistic[1] == f"{true_auc['logistic'].mean_auc:.4f}" and logistic[3] == "3 of 16"
    assert logistic[4] == "LogisticRegression" and logistic[5] == f"{true_auc['logistic'].mean_auc:.4f}"
    assert rows["POAD__seed=1"][4] == "DecisionTreeClassifier" and rows["POAD__seed=1"][3] == "9 of 12"
    assert rows["POAD__seed=1"][5] == f"{true_auc['tree'].mean_auc:.4f}"
    assert rows["NTPO__seed=0"][5].startswith("failed: ") and "NTPO__seed=1" not in rows
    both = [true_auc["logistic"].mean_auc, true_auc["tree"].mean_auc]
    spread = f"{np.mean(both):.4f} ± {np.std(both, ddof=1):.4f}"
    assert rows["POAD"][1:] == ["2", spread, f"{max(both):.4f}", spread]  # deterministic: re-scored alike
    assert rows["NTPO"][1:] == ["1", "0.7500", "0.7500", "-"]
    for label, value in REFERENCES.items():
        assert rows[label][3] == f"{value:.4f}"
    best = max((LOGISTIC, true_auc["logistic"].mean_auc), (TREE, true_auc["tree"].mean_auc), (BROKEN, 0.75),
               key=lambda pair: pair[1])[0]
    start = section.index("```python")
    assert section[start + 1:section.index("```", start + 1)] == best.rstrip().splitlines()
    (workdir / "cells" / "POAD__seed=0" / "cell.json").write_text(json.dumps({"status": "done"}))
    written = report.write_report(study, workdir).read_text()
    assert "Best programs" in written and "| POAD__seed=1 |" in written


def test_without_rescoring_no_program_runs_and_without_programs_no_section(tmp_path, monkeypatch):
    study = spec.load_study(write_study(tmp_path, {"reference": REFERENCES}))
    workdir = tmp_path / "runs"
    assert programs.best_programs_section(study, workdir) == []
    monkeypatch.setattr(programs, "rescore", lambda _: pytest.fail("re-scored without the option"))
    _keep(workdir, "POAD__seed=0", BROKEN, 0.8, 1, 8)
    header = next(row for row in programs.best_programs_section(study, workdir) if row.startswith("| cell |"))
    assert "re-scored" not in header


def test_a_program_whose_rescore_varies_is_reported_by_the_mean_of_its_repeats(tmp_path, monkeypatch):
    """A second run equal to the first stops there; one that differs is run `repeats` times in all."""
    workdir = tmp_path / "runs"
    _keep(workdir, "POAD__seed=0", LOGISTIC, 0.8, 1, 8)
    runs = iter([0.80, 0.80, 0.70, 0.90, 0.86, 0.78])

    def fake_rescore(_):
        auc = next(runs)
        return None, CandidateResult(success=True, auc_per_split=(auc,) * 5)

    monkeypatch.setattr(programs, "rescore", fake_rescore)
    cell = workdir / "cells" / "POAD__seed=0"
    assert programs.rescored(cell, repeats=4) == ("0.8000", 0.8)  # 0.80 twice: deterministic, two runs
    said, mean = programs.rescored(cell, repeats=4)  # 0.70, 0.90, 0.86, 0.78
    assert mean == pytest.approx(np.mean([0.70, 0.90, 0.86, 0.78]))
    assert said == f"{mean:.4f} (mean of 4: 0.7000-0.9000)"
    study = spec.load_study(write_study(tmp_path, {"rescore": True, "repeats": 10}))
    assert study.report_options.best_programs.repeats == 10


@pytest.mark.parametrize("option, message", [
    ({"rescore": "yes"}, "must be {\"rescore\": True or False"),
    ({"rescore": True, "repeats": 0}, "must be {\"rescore\": True or False"),
    ({"rescore": True, "repeats": True}, "must be {\"rescore\": True or False"),
    ({"reference": {"paper": "high"}}, "best_programs reference 'paper' must be a number, not 'high'"),
    ({"references": {}}, "must be {\"rescore\""),
    (["rescore"], "must be {\"rescore\""),
])
def test_a_malformed_option_is_refused_when_the_study_loads(tmp_path, option, message):
    with pytest.raises(spec.StudyError, match=message.replace("(", r"\(").replace("{", r"\{")):
        spec.load_study(write_study(tmp_path, option))
