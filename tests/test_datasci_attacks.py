"""A program's score cannot be gamed (issue 34): programs that hunt for test labels score no better than honest.

Each split is scored in a fresh sandbox that holds only that split's
training rows and labels and its test rows' features.  Every attack here
fits the honest logistic regression and overrules it with a leaked label
wherever its route found one (`Cheat`), so an attack that finds nothing
scores exactly the honest AUC, and one that finds the labels scores about
1.0.  On balance_scale a test row of one split is in another split's
training set with probability about 15/16, so any route from one split to
another is enough.  Against the code before issue 34 (one process for all
five splits) the stack walk scores 1.000 and the module-level memory 0.98.

The routes: the call stack, `inspect`, the garbage collector, `sys.modules`
(the runner's globals), module-level state across calls, the interpreter
(builtins, `sys.modules`, an attribute of numpy), environment variables,
files (through Python, and through C past the audit hook), SysV shared
memory, the kernel keyring, a process left behind and found through
`/proc`, scikit-learn's bundled copy of the data, and the trainer's data
files.  The same attack is then scored through each path that scores a
program: `env.step`, `python -m poad_jax.best_program` and
`python -m poad_jax.evaluate --best-program`.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import secrets

import numpy as np
import pytest

import envs_py
from envs_py.datasci import isolation, sandbox
from envs_py.datasci.datasets import load_dataset
from envs_py.datasci.sandbox import (SandboxLimits, WarmSession, evaluate_candidate, roc_auc, sandbox_status,
                                     split_indices)

REPO = pathlib.Path(__file__).resolve().parents[1]
LIMITS = SandboxLimits(wall_seconds=60.0)  # generous: five sandboxes on a loaded 2-core machine
MARGIN = 0.002  # an attack must score at most the honest AUC plus this
HONEST = (
    "from sklearn.linear_model import LogisticRegression\n"
    "def build_model(x_train, y_train):\n"
    "    return LogisticRegression(max_iter=1000).fit(x_train, y_train)\n"
)

# What every attack shares: collect (row -> label) from whatever it finds,
# then predict the honest probabilities except where a label leaked.
CHEAT = '''
import json, os
import numpy as np
from sklearn.linear_model import LogisticRegression


def harvest(mapping, table, depth=1):
    """Adds (row -> label) of each training set in `mapping` and the dicts in it: the runner's data, either layout."""
    try:
        for value in list(mapping.values()) if depth else ():
            if isinstance(value, dict):
                harvest(value, table, depth - 1)
        keys = [key for key in list(mapping) if isinstance(key, str) and key.startswith("y_train")]
        everything = mapping.get("X")
        for key in keys:
            suffix = key[len("y_train"):]
            rows = mapping.get("x_train" + suffix)
            if rows is None and everything is not None and "train" + suffix in mapping:
                rows = np.asarray(everything)[mapping["train" + suffix]]
            if rows is not None:
                table.update(zip(map(tuple, np.asarray(rows).tolist()), map(int, mapping[key])))
    except Exception:
        pass
    return table


def remember(table, x_train, y_train):
    table.update(zip(map(tuple, x_train.tolist()), map(int, y_train)))
    return table


def read_files(places, name, table):
    for place in places:
        try:
            unpack(open(os.path.join(place, name)).read(), table)
        except Exception:
            pass
    return table


def pack(table):
    return json.dumps([[list(row), label] for row, label in table.items()])


def unpack(text, table):
    try:
        table.update((tuple(row), int(label)) for row, label in json.loads(text))
    except Exception:
        pass
    return table


class Cheat:
    """The honest logistic regression, overruled wherever a label leaked."""

    def __init__(self, x_train, y_train, table):
        self.honest = LogisticRegression(max_iter=1000).fit(x_train, y_train)
        self.classes_, self.table = self.honest.classes_, dict(table)

    def predict_proba(self, x):
        proba = self.honest.predict_proba(x)
        for index, row in enumerate(np.asarray(x).tolist()):
            label = self.table.get(tuple(row))
            if label is not None and label in self.classes_:
                proba[index] = (self.classes_ == label).astype(float)
        return proba
'''

ROUTES = {
    "stack walk (sys._getframe)": '''
import sys

def build_model(x_train, y_train):
    table, frame = {}, sys._getframe(1)
    while frame is not None:
        harvest(frame.f_globals, table)
        harvest(frame.f_locals, table)
        frame = frame.f_back
    return Cheat(x_train, y_train, table)
''',
    "inspect.stack": '''
import inspect

def build_model(x_train, y_train):
    table = {}
    for frame in inspect.stack(0):
        harvest(frame.frame.f_globals, table)
    return Cheat(x_train, y_train, table)
''',
    "gc.get_objects": '''
import gc

def build_model(x_train, y_train):
    table = {}
    for thing in gc.get_objects():  # arrays are not tracked, but the dicts that hold them are found here
        if isinstance(thing, dict):
            harvest(thing, table)
    return Cheat(x_train, y_train, table)
''',
    "sys.modules (the runner's globals)": '''
import sys

def build_model(x_train, y_train):
    table = {}
    for module in list(sys.modules.values()):
        harvest(getattr(module, "__dict__", {}), table)
    return Cheat(x_train, y_train, table)
''',
    "module-level memory across calls": '''
SEEN = {}

def build_model(x_train, y_train):
    model = Cheat(x_train, y_train, SEEN)
    remember(SEEN, x_train, y_train)
    return model
''',
    "interpreter stash (builtins, sys.modules, numpy)": '''
import builtins, sys, types

def build_model(x_train, y_train):
    places = [builtins.__dict__.setdefault("_poad_stash", {}),
              sys.modules.setdefault("_poad_stash", types.ModuleType("_poad_stash")).__dict__.setdefault("t", {}),
              np.__dict__.setdefault("_poad_stash", {})]
    table = {}
    for place in places:
        table.update(place)
    model = Cheat(x_train, y_train, table)
    for place in places:
        remember(place, x_train, y_train)
    return model
''',
    "environment variables": '''
import os

def build_model(x_train, y_train):
    table = unpack(os.environ.get("POAD_STASH", "[]"), {})
    model = Cheat(x_train, y_train, table)
    remember(table, x_train, y_train)
    os.environ["POAD_STASH"] = pack(table)
    return model
''',
    "files (cwd, HOME, TMPDIR, /tmp, /var/tmp, /dev/shm)": '''
import os, tempfile
PLACES = [os.getcwd(), os.path.expanduser("~"), tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"]

def build_model(x_train, y_train):
    table = read_files(PLACES, "poad_stash.json", {})
    model = Cheat(x_train, y_train, table)
    remember(table, x_train, y_train)
    for place in PLACES:
        try:
            with open(os.path.join(place, "poad_stash.json"), "w") as handle:
                handle.write(pack(table))
        except Exception:
            pass
    return model
''',
    "files through C, past the audit hook": '''
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
PLACES = ["/tmp", "/var/tmp", "/dev/shm", "/dev", "/", "/sandbox", os.getcwd()]

def build_model(x_train, y_train):
    table = read_files(PLACES, "poad_stash_c.json", {})
    model = Cheat(x_train, y_train, table)
    remember(table, x_train, y_train)
    data = pack(table).encode()
    for place in PLACES:
        fd = libc.open(os.path.join(place, "poad_stash_c.json").encode(), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        if fd >= 0:
            libc.write(fd, data, len(data))
            libc.close(fd)
    return model
''',
    "SysV shared memory": '''
import ctypes, struct
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
SIZE = 1 << 20

def build_model(x_train, y_train):
    table = {}
    segment = libc.shmget(0x504F4144, SIZE, 0o1000 | 0o666)  # IPC_CREAT
    memory = libc.shmat(segment, None, 0) if segment >= 0 else None
    if memory not in (None, ctypes.c_void_p(-1).value):
        length = struct.unpack("=Q", ctypes.string_at(memory, 8))[0]
        if 0 < length < SIZE - 8:
            unpack(ctypes.string_at(memory + 8, length).decode(), table)
    model = Cheat(x_train, y_train, table)
    remember(table, x_train, y_train)
    data = pack(table).encode()
    if memory not in (None, ctypes.c_void_p(-1).value) and len(data) < SIZE - 8:
        ctypes.memmove(memory, struct.pack("=Q", len(data)) + data, len(data) + 8)
    return model
''',
    "kernel keyring": '''
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
KEYCTL = KEYCTL_NUMBER  # add_key and request_key are the two numbers before it on every architecture
DESCRIPTION = b"poad_stash_NONCE"

def build_model(x_train, y_train):
    table = {}
    key = libc.syscall(KEYCTL - 1, b"user", DESCRIPTION, None, 0)  # request_key
    if key > 0:
        buffer = ctypes.create_string_buffer(1 << 15)
        length = libc.syscall(KEYCTL, 11, key, buffer, len(buffer))  # KEYCTL_READ
        if 0 < length <= len(buffer):
            unpack(buffer.raw[:length].decode(), table)
    model = Cheat(x_train, y_train, table)
    remember(table, x_train, y_train)
    data = pack(table).encode()
    key = libc.syscall(KEYCTL - 2, b"user", DESCRIPTION, data, len(data), -4)  # add_key to the user keyring
    if key > 0:
        libc.syscall(KEYCTL, 15, key, 120)  # KEYCTL_SET_TIMEOUT: gone in 2 minutes even where it worked
    return model
''',
    "a process left behind, found through /proc": '''
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)

def read_past_the_hook(path):
    fd = libc.open(path.encode(), os.O_RDONLY)
    if fd < 0:
        return b""
    buffer = ctypes.create_string_buffer(1 << 20)
    length = libc.read(fd, buffer, len(buffer))
    libc.close(fd)
    return buffer.raw[:max(length, 0)]

def build_model(x_train, y_train):
    table = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            for entry in read_past_the_hook(f"/proc/{pid}/environ").split(b"\\0"):
                if entry.startswith(b"POAD_STASH="):
                    unpack(entry[len(b"POAD_STASH="):].decode(), table)
    model = Cheat(x_train, y_train, table)
    remember(table, x_train, y_train)
    if libc.fork() == 0:  # past the audit hook: a `sleep` that keeps the table in its environment
        argv = (ctypes.c_char_p * 3)(b"/bin/sleep", b"1000", None)
        envp = (ctypes.c_char_p * 2)(b"POAD_STASH=" + pack(table).encode(), None)
        libc.execve(b"/bin/sleep", argv, envp)
        libc._exit(1)
    return model
''',
}


def attack_program(route: str) -> str:
    """The full program of an attack: the shared `Cheat` part, then the route's build_model."""
    code = CHEAT + ROUTES[route]
    return code.replace("KEYCTL_NUMBER", str(isolation.keyctl_number() or 0)).replace("NONCE", secrets.token_hex(8))


@pytest.fixture(scope="module")
def balance_scale():
    X, y = load_dataset("balance_scale")
    assert len({tuple(row) for row in X.tolist()}) == len(X)  # no test row is also a training row of its split
    return X, y


@pytest.fixture(scope="module")
def sandboxed():
    """Fails (or, where the kernel refuses namespaces, skips) unless candidates run in the sandbox here."""
    status = sandbox_status()
    if not status.ok:
        if "bwrap:" in status.reason and "namespace" in status.reason:
            pytest.skip(f"the kernel refuses the sandbox's namespaces: {status.reason}")
        pytest.fail(f"the sandbox does not hold here: {status.reason}")
    return status


@pytest.fixture(scope="module")
def honest_auc(balance_scale, sandboxed):
    result = evaluate_candidate(HONEST, *balance_scale, limits=LIMITS)
    assert result.success, result.error
    return result.mean_auc


def _no_better_than(result, honest: float) -> None:
    """The attack failed, or scored at most the honest AUC plus MARGIN."""
    assert not result.success or result.mean_auc <= honest + MARGIN, (result.mean_auc, honest)


def test_an_attack_that_finds_nothing_scores_the_honest_auc(balance_scale, honest_auc):
    """Guards the others: `Cheat` with an empty table is the honest model, to the last digit."""
    code = CHEAT + "def build_model(x_train, y_train):\n    return Cheat(x_train, y_train, {})\n"
    assert evaluate_candidate(code, *balance_scale, limits=LIMITS).mean_auc == honest_auc


def test_labels_from_another_split_would_give_the_game_away(balance_scale, honest_auc):
    """Guards the others: the leak they hunt for is worth a near-perfect score (run in the trainer, no sandbox)."""
    X, y = balance_scale
    namespace = {}
    exec(attack_program("module-level memory across calls"), namespace)
    splits = split_indices(len(y))
    for train, _ in splits[1:]:
        namespace["build_model"](X[train], y[train])  # remember every other split's training rows
    train, test = splits[0]
    proba = namespace["build_model"](X[train], y[train]).predict_proba(X[test])
    assert roc_auc(y[test], proba, sorted(set(y.tolist()))) > 0.97 > honest_auc + MARGIN


@pytest.mark.long
@pytest.mark.parametrize("route", list(ROUTES))
def test_attack_scores_no_better_than_honest(route, balance_scale, honest_auc):
    if route == "kernel keyring" and isolation.keyctl_number() is None:
        pytest.skip("keyctl's number is unknown on this machine")
    _no_better_than(evaluate_candidate(attack_program(route), *balance_scale, limits=LIMITS), honest_auc)


def test_each_split_sees_only_its_own_rows(balance_scale, sandboxed):
    """The runner's data are split 0's training rows and labels, its test rows' features and the classes."""
    code = (
        "import json, sys\n"
        "def build_model(x_train, y_train):\n"
        "    data = sys.modules['__main__'].DATA\n"
        "    raise RuntimeError('SEEN ' + json.dumps({k: list(v.shape) for k, v in data.items()}))\n"
    )
    result = evaluate_candidate(code, *balance_scale, limits=LIMITS)
    X, _ = balance_scale
    train, test = split_indices(len(X))[0]
    seen = json.loads(result.error.split("SEEN ", 1)[1])
    assert seen == {"x_train": [len(train), X.shape[1]], "y_train": [len(train)], "x_test": [len(test), X.shape[1]],
                    "classes": [3]}


SKLEARN_LOOKUP = '''
from sklearn.datasets import load_breast_cancer

def build_model(x_train, y_train):
    try:
        bundled = load_breast_cancer()
        table = dict(zip(map(tuple, bundled.data.tolist()), map(int, bundled.target)))
    except Exception:
        table = {}
    return Cheat(x_train, y_train, table)
'''


def test_scikit_learns_bundled_copy_of_the_data_is_hidden(sandboxed):
    X, y = load_dataset("sklearn_breast_cancer")
    honest = evaluate_candidate(HONEST, X, y, limits=LIMITS)
    attack = evaluate_candidate(CHEAT + SKLEARN_LOOKUP, X, y, limits=LIMITS)
    assert honest.success and attack.success, attack.error
    assert attack.auc_per_split == honest.auc_per_split  # found nothing: exactly the honest model


def test_the_trainers_data_files_are_not_visible(balance_scale, datasets_dir, sandboxed):
    paths = [str(datasets_dir), str(pathlib.Path(envs_py.__file__).parent), str(pathlib.Path.home() / ".cache")]
    code = f"import os\nseen = [p for p in {paths!r} if os.path.exists(p)]\nassert not seen, seen\n" + HONEST
    result = evaluate_candidate(code, *balance_scale, limits=LIMITS)
    assert result.success, result.error


# How far a deterministic program's per-split ROC AUC may move between two CPUs.  An estimator that its
# iteration cap stops before convergence (a default lbfgs LogisticRegression on unscaled features) ends where
# the CPU's floating-point path takes it: pharyngitis' kept program re-scored on an AMD EPYC without native
# bfloat16 moved by up to 0.0050 per split from its record (an EPYC with it).  A sandbox fault moves scores by
# far more (labels it finds push the AUC towards 1; a wrong split changes every digit of every split).
CROSS_CPU_AUC_TOLERANCE = 0.02


@pytest.mark.long
@pytest.mark.parametrize("record", sorted((REPO / "docs" / "results" / "raw").rglob("best_program.json")),
                         ids=lambda path: path.parent.name)
def test_kept_best_programs_rescore_to_their_recorded_aucs(record, sandboxed, tmp_path, datasets_dir,
                                                           monkeypatch):
    """Honest programs score what they did before issue 34: to the last digit on the machine that recorded
    them (`BestProgram.machine` equal to this one's), within `CROSS_CPU_AUC_TOLERANCE` per split on another
    CPU or where the record names none (a copy: reading may repair files).  A program that draws unseeded
    randomness (a RandomForestClassifier without `random_state`) cannot: one whose re-score differs from its
    record is scored once more, and passes only if that score differs from the first too (its own
    randomness, not the sandbox or the CPU, moved it)."""
    from poad_jax.run import best_program, hardware

    monkeypatch.setenv("POAD_DATA_DIR", str(datasets_dir))  # the datasets that are not built from a definition
    (tmp_path / record.name).write_text(record.read_text())
    best, result = best_program.rescore(tmp_path)
    assert result.success, result.error
    if result.auc_per_split == best.auc_per_split and result.mean_auc == best.mean_auc:
        return
    _, again = best_program.rescore(tmp_path)
    assert again.success, again.error
    if again.auc_per_split != result.auc_per_split:
        return  # the program's own randomness
    assert best.machine != hardware.scoring_machine(), (
        f"{record}: re-scored twice to {result.auc_per_split} on the machine that recorded {best.auc_per_split}")
    moved = max(abs(a - b) for a, b in zip(result.auc_per_split, best.auc_per_split, strict=True))
    assert moved <= CROSS_CPU_AUC_TOLERANCE, (
        f"{record}: re-scored twice to {result.auc_per_split}, recorded {best.auc_per_split} on "
        f"{best.machine or 'an unrecorded machine'}: {moved:.4f} apart, more than another CPU explains")


# ---------------------------------------------------------------------------
# Every path that scores a program goes through the same sandbox function.

STACK_WALK = "stack walk (sys._getframe)"


def test_env_step_scores_an_attack_no_better_than_honest(balance_scale, honest_auc):
    env = envs_py.make("datasci/balance_scale", template="plain", timeout_s=LIMITS.wall_seconds)
    env.reset()
    step = env.step(f"```python\n{attack_program(STACK_WALK)}```")
    assert step.reward <= honest_auc + MARGIN


def _kept_attack(workdir: pathlib.Path) -> pathlib.Path:
    """A run directory whose best program is the stack walk, recorded (as the old sandbox scored it) at 1.0."""
    from poad_jax.run import best_program

    workdir.mkdir()
    best_program.write_best(workdir, best_program.BestProgram(
        program=attack_program(STACK_WALK), mean_auc=1.0, auc_per_split=(1.0,) * 5, env="datasci/balance_scale",
        env_kwargs={"template": "plain", "timeout_s": LIMITS.wall_seconds}, dataset="balance_scale", update=1,
        env_steps=1))
    return workdir


def _rescored_auc(output: str) -> float | None:
    """The mean AUC on the `re-run:` line of the best-program report, or None when it failed."""
    for line in output.splitlines():
        if line.startswith("re-run:"):
            return float(line.split("mean AUC", 1)[1].split()[0])
    return None


@pytest.mark.parametrize("command", ["best_program", "evaluate --best-program"])
def test_rescoring_a_kept_attack_gives_no_better_than_honest(command, tmp_path, capsys, honest_auc):
    workdir = _kept_attack(tmp_path / "run")
    if command == "best_program":
        from poad_jax.run import best_program

        status = best_program.main(["--workdir", str(workdir)])
    else:
        from poad_jax.tools import evaluate

        status = evaluate.main(["--workdir", str(workdir), "--best-program"])
    rescored = _rescored_auc(capsys.readouterr().out)
    assert status == 1 or (status == 0 and rescored <= honest_auc + MARGIN), (status, rescored)


def test_unsandboxed_runs_also_give_each_split_a_fresh_process(monkeypatch, balance_scale, honest_auc, tmp_path):
    """Without bubblewrap (allowed explicitly) the Python-level routes are closed too: a process per split."""
    monkeypatch.setattr(isolation, "find_tool", lambda name: None if name == "bwrap" else "/usr/bin/" + name)
    monkeypatch.setattr(sandbox, "_statuses", {})
    monkeypatch.setattr(sandbox, "_warned_unsandboxed", False)
    monkeypatch.delenv(isolation.ALLOW_UNSANDBOXED_ENV, raising=False)
    limits = dataclasses.replace(LIMITS, allow_unsandboxed=True)
    for route in (STACK_WALK, "module-level memory across calls", "files (cwd, HOME, TMPDIR, /tmp, /var/tmp, /dev/shm)"):
        result = evaluate_candidate(attack_program(route), *balance_scale, limits=limits, base_dir=tmp_path)
        assert not result.sandboxed
        _no_better_than(result, honest_auc)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------
# Issue 41: the warm sandbox kept between programs (the env's path), and the cold path kept selectable.


@pytest.mark.long
@pytest.mark.parametrize("route", list(ROUTES))
def test_attack_run_twice_in_a_kept_warm_sandbox_scores_no_better_than_honest(route, balance_scale, honest_auc):
    """Two runs of the same attack (one key name) share a kept sandbox: the second finds nothing the first left."""
    if route == "kernel keyring" and isolation.keyctl_number() is None:
        pytest.skip("keyctl's number is unknown on this machine")
    code = attack_program(route)
    with WarmSession() as session:
        for _ in range(2):
            result = session.evaluate(code, *balance_scale, limits=LIMITS)
            assert result.warm
            _no_better_than(result, honest_auc)


@pytest.mark.parametrize("route", [STACK_WALK, "files through C, past the audit hook",
                                   "a process left behind, found through /proc"])
def test_attack_on_the_cold_path_scores_no_better_than_honest(route, balance_scale, honest_auc):
    result = evaluate_candidate(attack_program(route), *balance_scale, limits=dataclasses.replace(LIMITS, warm=False))
    assert not result.warm and result.sandboxed
    _no_better_than(result, honest_auc)
