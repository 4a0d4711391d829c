"""scripts/datasci_timeline.py: per update, each thread's estimator, attempt and outcome, read back by hand."""

from __future__ import annotations

import gzip
import importlib.util
import json
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("datasci_timeline", REPO / "scripts" / "datasci_timeline.py")
timeline_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(timeline_script)


def test_estimator_is_the_first_estimator_built_hallucinated_or_not():
    assert timeline_script.estimator("from x import y\nreturn LogisticRegression(C=2).fit(a, b)") == "LogisticRegression"
    assert timeline_script.estimator("m = LinearClassifier()\nn = SVC()") == "LinearClassifier"
    assert timeline_script.estimator("import sklearn\nroc_auc_score(y, p)") == "-"
    assert timeline_script.estimator("s = StandardScaler()\nm = LogisticRegressionCV()") == "LogisticRegressionCV"
    assert timeline_script.estimator("make_pipeline(MinMaxScaler(), LinearModel())") == "LinearModel"
    assert timeline_script.estimator("x = StandardScaler().fit_transform(x)") == "-"
    assert timeline_script.estimator(None) == "-"


def test_timeline_orders_threads_and_reads_metrics(tmp_path, capsys):
    actions = [  # written out of order, as threads of a resumed run may be
        {"update": 2, "thread": 1, "action": "x", "info": {"program": "SVC()", "attempt": 2, "success": False}},
        {"update": 1, "thread": 1, "action": "RandomForestClassifier()", "info": {"attempt": 1, "success": True}},
        {"update": 1, "thread": 0, "action": "x", "info": {"program": "GaussianNB()", "success": True}},
        {"update": 2, "thread": 0, "action": "nothing", "info": {"attempt": 3, "success": False}},
    ]
    (tmp_path / "actions.jsonl").write_text("".join(json.dumps(a) + "\n" for a in actions))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"update": 1, "approx_kl": 0.0125, "advantage_mean": -0.5,
                                                        "explained_variance": 0.25}) + "\n"
                                            + json.dumps({"update": 2, "approx_kl": None}) + "\n")
    lines = timeline_script.timeline(tmp_path)
    assert lines[0].split() == ["1", "GaussianNB#1+", "RandomForestClassifier#1+", "KL", "0.0125", "adv", "mean",
                                "-0.5", "EV", "0.25"]
    assert lines[1].split() == ["2", "-#3-", "SVC#2-"]  # a null statistic is left out
    assert timeline_script.timeline(tmp_path, first=2) == lines[1:]
    snapshot = tmp_path / "snapshot"  # a raw snapshot keeps the log gzipped
    snapshot.mkdir()
    (snapshot / "actions.jsonl.gz").write_bytes(gzip.compress((tmp_path / "actions.jsonl").read_bytes()))
    assert [line.split()[:3] for line in timeline_script.timeline(snapshot)] == [line.split()[:3] for line in lines]
    for missing in ([str(tmp_path / "missing")], [str(tmp_path), "--from=3"]):
        assert timeline_script.main(missing) == 2
        assert capsys.readouterr().err.startswith("error: ")
