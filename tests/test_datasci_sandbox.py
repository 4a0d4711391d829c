"""The sandbox against hostile programs (issue 5 §4) and against honest ones.

Every hostile program must give the failure (or its honest AUC) within the
wall-clock limit + 5 s, leave no child process and no file outside its
temporary directory, and leave this test process alive.
"""

from __future__ import annotations

import os
import pathlib
import tempfile
import time

import sys

import numpy as np
import psutil
import pytest
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from envs_py.datasci.datasets import load_dataset
from envs_py.datasci.sandbox import SandboxLimits, evaluate_candidate, evaluate_many, split_indices

WALL = 4.0
GRACE = 5.0
LIMITS = SandboxLimits(wall_seconds=WALL, cpu_seconds=10, memory_bytes=3 << 30, file_bytes=8 << 20,
                       max_output_chars=1 << 16)
GOOD_MODEL = (
    "from sklearn.linear_model import LogisticRegression\n"
    "def build_model(x_train, y_train):\n"
    "    return LogisticRegression(max_iter=1000).fit(x_train, y_train)\n"
)


@pytest.fixture(scope="module")
def binary_data():
    X, y = load_dataset("sklearn_breast_cancer")
    return X[:, :4], y  # few features: logistic regression converges fast


@pytest.fixture(scope="module")
def multiclass_data():
    return load_dataset("balance_scale")


@pytest.fixture
def run(tmp_path, binary_data):
    """Runs a candidate with short limits and checks the common guarantees."""
    base = tmp_path / "sandboxes"
    base.mkdir()
    me = psutil.Process()

    def _run(code, data=binary_data, limits=LIMITS):
        start = time.monotonic()
        result = evaluate_candidate(code, *data, limits=limits, base_dir=base)
        elapsed = time.monotonic() - start
        assert elapsed < limits.wall_seconds + GRACE, elapsed
        assert me.children(recursive=True) == []
        assert list(base.iterdir()) == []  # the temporary directory is gone
        return result

    return _run


def _failed(result, *fragments):
    assert not result.success
    assert result.auc_per_split == ()
    for fragment in fragments:
        assert fragment in result.error, result.error
    return result


def test_infinite_loop_times_out(run):
    _failed(run("def build_model(x_train, y_train):\n    while True:\n        pass\n"), "TimeoutError")


def test_fork_bomb_is_refused(run):
    _failed(run("import os\nwhile True:\n    os.fork()\n"), "os.fork")


def test_forked_children_past_the_audit_hook_are_killed(run):
    # fork() through C escapes the audit hook; the process-group kill must
    # still remove every child (bounded to 8 so the machine stays usable).
    code = (
        "import ctypes, time\n"
        "libc = ctypes.CDLL(None)\n"
        "for _ in range(8):\n"
        "    if libc.fork() == 0:\n"
        "        time.sleep(1000)\n"
        "time.sleep(1000)\n"
    )
    _failed(run(code), "TimeoutError")


def test_allocating_50_gb_fails(run):
    _failed(run("import numpy as np\nbig = np.ones(50 * 2**30 // 8)\n"), "MemoryError")


def test_one_gb_of_stdout_through_print_fails(run):
    code = "def build_model(x_train, y_train):\n    for _ in range(1024):\n        print('x' * 2**20)\n"
    _failed(run(code), "output limit")


def test_one_gb_of_stdout_through_the_descriptor_fails(run):
    code = "import os\nchunk = b'x' * 2**20\nfor _ in range(1024):\n    os.write(1, chunk)\n"
    _failed(run(code))


def test_writing_outside_the_temp_dir_fails(run, tmp_path):
    target = tmp_path / "escaped.txt"
    code = f"open({str(target)!r}, 'w').write('x')\n" + GOOD_MODEL
    _failed(run(code), "outside the working directory")
    assert not target.exists()


def test_removing_and_renaming_outside_the_temp_dir_fail(run, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    _failed(run(f"import os\nos.rename({str(victim)!r}, 'stolen.txt')\n"), "os.rename")
    _failed(run(f"import os\nos.remove({str(victim)!r})\n"), "os.remove")
    assert victim.read_text() == "keep"


def test_writing_inside_the_temp_dir_is_allowed(run):
    code = "open('notes.txt', 'w').write('scratch')\n" + GOOD_MODEL
    assert run(code).success


def test_parent_environment_is_not_visible(run, monkeypatch):
    monkeypatch.setenv("POAD_SECRET_FOR_TEST", "s3cr3t")
    code = (
        "import os\n"
        "leaked = 'POAD_SECRET_FOR_TEST' in os.environ\n"
        "try:\n"
        "    leaked = leaked or b's3cr3t' in open(f'/proc/{os.getppid()}/environ', 'rb').read()\n"
        "except OSError:\n"
        "    pass\n"
        "assert not leaked, 'LEAKED'\n"
    ) + GOOD_MODEL
    assert run(code).success


def test_opening_a_socket_fails(run):
    code = "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_STREAM).connect(('127.0.0.1', 9))\n"
    _failed(run(code), "socket")


def test_network_namespace_when_the_kernel_allows(run):
    result = run(GOOD_MODEL)
    assert result.success
    if not result.network_isolated:
        pytest.skip("this kernel refuses an unprivileged network namespace; the audit hook still refuses sockets")
    code = (
        "import socket\n"
        "names = [name for _, name in socket.if_nameindex()]\n"
        "assert names in ([], ['lo']), names\n"
    ) + GOOD_MODEL
    assert run(code).success


def test_killing_the_parent_fails_and_parent_lives(run):
    _failed(run("import os\ndef build_model(x_train, y_train):\n    os.kill(os.getppid(), 9)\n"), "os.kill")
    assert psutil.Process().is_running()


def test_subprocess_is_refused(run):
    _failed(run("import subprocess\nsubprocess.run(['sleep', '100'])\n"), "subprocess")


def test_sys_exit_before_fitting_fails(run):
    _failed(run("import sys\nsys.exit(0)\n" + GOOD_MODEL), "SystemExit")


def test_hard_exit_before_fitting_fails(run):
    _failed(run("import os\nos._exit(0)\n"), "without a result")


@pytest.mark.parametrize("returned", ["None", "'classifier'", "__import__('sklearn.linear_model').linear_model.LinearRegression().fit(x_train, y_train)"])
def test_returning_a_non_classifier_fails(run, returned):
    _failed(run(f"def build_model(x_train, y_train):\n    return {returned}\n"), "predict_proba")


CONSTANT_MODEL = (
    "import numpy as np\n"
    "class Constant:\n"
    "    def fit(self, x, y):\n"
    "        self.classes_ = np.unique(y)\n"
    "        return self\n"
    "    def predict_proba(self, x):\n"
    "        return np.full((len(x), len(self.classes_)), VALUE)\n"
    "def build_model(x_train, y_train):\n"
    "    return Constant().fit(x_train, y_train)\n"
)


@pytest.mark.parametrize("data_name", ["binary_data", "multiclass_data"])
def test_constant_probabilities_score_one_half(run, request, data_name):
    result = run(CONSTANT_MODEL.replace("VALUE", "0.25"), data=request.getfixturevalue(data_name))
    assert result.success
    assert result.auc_per_split == (0.5,) * 5


def test_nan_probabilities_fail(run):
    _failed(run(CONSTANT_MODEL.replace("VALUE", "float('nan')")), "NaN")


def test_syntax_error_fails(run):
    _failed(run("def build_model(x_train, y_train)\n    return 1\n"), "SyntaxError")


def test_missing_module_fails(run):
    _failed(run("import no_such_module_xyz\n" + GOOD_MODEL), "ModuleNotFoundError", "no_such_module_xyz")


def test_odd_text_and_huge_errors_stay_small_failures(run):
    _failed(run("x = '\ud800'\nraise ValueError('E' * 10**6)\n"), "ValueError")
    assert len(run("raise ValueError('E' * 10**6)\n").error) <= 2000
    _failed(run("x = 1\x00\n"))


def test_missing_build_model_fails(run):
    _failed(run("x = 1\n"), "build_model")


def _direct_aucs(make_model, X, y):
    aucs = []
    for train, test in split_indices(len(y)):
        proba = make_model().fit(X[train], y[train]).predict_proba(X[test])
        if proba.shape[1] == 2:
            aucs.append(roc_auc_score(y[test], proba[:, 1]))
        else:
            aucs.append(roc_auc_score(y[test], proba, multi_class="ovo"))
    return np.array(aucs)


def test_logistic_regression_scores_the_direct_auc(run, binary_data):
    result = run(GOOD_MODEL)
    assert result.success
    expected = _direct_aucs(lambda: LogisticRegression(max_iter=1000), *binary_data)
    np.testing.assert_allclose(result.auc_per_split, expected, rtol=0, atol=1e-12)
    assert result.mean_auc == pytest.approx(expected.mean(), abs=1e-12)


def test_random_forest_scores_the_direct_auc_multiclass(run, multiclass_data):
    code = (
        "from sklearn.ensemble import RandomForestClassifier\n"
        "def build_model(x_train, y_train):\n"
        "    return RandomForestClassifier(n_estimators=30, random_state=0).fit(x_train, y_train)\n"
    )
    result = run(code, data=multiclass_data)
    assert result.success
    expected = _direct_aucs(lambda: RandomForestClassifier(n_estimators=30, random_state=0), *multiclass_data)
    np.testing.assert_allclose(result.auc_per_split, expected, rtol=0, atol=1e-12)


def test_pool_runs_candidates_in_parallel_with_the_same_scores(binary_data):
    codes = [GOOD_MODEL, "raise RuntimeError('bad')\n", GOOD_MODEL]
    results = evaluate_many(codes, *binary_data, limits=LIMITS, max_workers=3)
    assert [r.success for r in results] == [True, False, True]
    assert results[0].auc_per_split == results[2].auc_per_split
    assert "bad" in results[1].error
    assert psutil.Process().children(recursive=True) == []


def test_bad_limits_are_refused():
    with pytest.raises(ValueError, match="wall_seconds"):
        SandboxLimits(wall_seconds=0)


def interpreter_for_uid(uid: int, scratch: pathlib.Path) -> str | None:
    """A Python that user `uid` can start with numpy and scikit-learn, or None.

    `$POAD_TEST_SANDBOX_PYTHON`, else this interpreter, else a venv made in
    the world-readable `scratch` from a system Python (/usr/bin/python3 of the
    same minor version) whose `.pth` file points at this environment's
    site-packages: the venv's own interpreter usually lives under a directory
    only root may enter (/root/.pyenv here).
    """
    import subprocess
    import sysconfig

    from envs_py.datasci.sandbox import interpreter_usable_by

    candidates = [os.environ.get("POAD_TEST_SANDBOX_PYTHON") or sys.executable]
    system = pathlib.Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    if system.is_file():
        venv = scratch / "venv"
        made = subprocess.run([str(system), "-m", "venv", "--without-pip", str(venv)], capture_output=True)
        if made.returncode == 0:
            site = next(venv.glob("lib/python3*/site-packages"))
            (site / "poad_parent.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
            for path in [scratch, *scratch.rglob("*")]:
                path.chmod(path.stat().st_mode | 0o055)
            candidates.append(str(venv / "bin" / "python"))
    return next((python for python in candidates if interpreter_usable_by(python, uid)), None)


def test_unprivileged_user_cannot_signal_parent_or_write_home(tmp_path, binary_data):
    # Only where this process is root (else the sandbox has no user to drop
    # to, and the audit hook is the layer that refuses these) and some
    # interpreter can be started by `nobody`.
    if os.geteuid() != 0:
        pytest.skip("not running as root: the sandbox has no user to drop to")
    with tempfile.TemporaryDirectory(prefix="poad_nobody_python_") as scratch:
        pathlib.Path(scratch).chmod(0o755)
        python = interpreter_for_uid(LIMITS.run_as_uid, pathlib.Path(scratch))
        if python is None:
            pytest.skip(f"no Python here can be started by uid {LIMITS.run_as_uid} (set POAD_TEST_SANDBOX_PYTHON)")
        _check_unprivileged_run(tmp_path, binary_data, python)


def _check_unprivileged_run(tmp_path, binary_data, python):
    from envs_py.datasci.sandbox import traversable_by_others

    base = pathlib.Path(tempfile.gettempdir())
    assert traversable_by_others(base)
    target = tmp_path.parent / "escape_by_ctypes.txt"
    code = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None)\n"
        f"assert os.getuid() == {LIMITS.run_as_uid}\n"
        "assert libc.kill(os.getppid(), 0) != 0, 'could signal the parent'\n"
        f"assert libc.open({str(target).encode()!r}, 0o101, 0o644) < 0, 'wrote outside'\n"
    ) + GOOD_MODEL
    result = evaluate_candidate(code, *binary_data, limits=LIMITS, base_dir=base, python=python)
    assert result.success, result.error
    assert not target.exists()
