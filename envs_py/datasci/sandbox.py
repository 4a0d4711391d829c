"""Runs generated `build_model` code in an isolated process and scores it.

`evaluate_candidate(code, X, y, limits)` writes the data and the code into a
fresh temporary directory, starts `python -I _runner.py DIR` in its own
session (process group) with a scrubbed environment, and waits at most
`limits.wall_seconds`.  The runner applies resource limits, closes the
network where the kernel allows, confines the code with an audit hook and
writes the test-set probabilities of each split; this process computes the
ROC AUCs.  The trainer never imports or executes generated code itself.

Guarantees (Linux): wall-clock timeout that kills the whole process group;
CPU seconds, address space, file size and process-count limits; no core
dumps; environment scrubbed; working directory, HOME and TMPDIR set to the
temporary directory, removed afterwards.  When this process runs as root,
the candidate runs as an unprivileged user (`nobody` by default), so it can
neither signal the trainer nor write outside world-writable places.  The
audit hook refuses Python-level writes outside the directory, sockets,
subprocesses, forks and signals; code that calls C directly (ctypes) can get
past the hook, not past the OS limits.  See docs/datasci.md.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import os
import pathlib
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from typing import Sequence

import numpy as np

RUNNER = pathlib.Path(__file__).with_name("_runner.py")
NUM_SPLITS = 5
TEST_FRACTION = 0.5
ERROR_TAIL_CHARS = 2000
_GIB = 1 << 30
_MIB = 1 << 20
NOBODY_UID = 65534


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Limits of one candidate run.

    Attributes:
      wall_seconds: wall clock for the whole run (start, imports, all fits).
      cpu_seconds: CPU time (RLIMIT_CPU).
      memory_bytes: address space (RLIMIT_AS).
      file_bytes: largest file the candidate may write (RLIMIT_FSIZE).
      max_processes: RLIMIT_NPROC for the candidate's user (counts every
        process and thread of that user; not enforced for root).
      max_output_chars: characters the candidate may print before it fails.
      isolate_network: move the candidate into an empty network namespace
        when the kernel allows it (the audit hook refuses sockets anyway).
      run_as_uid: user id to run as when this process is root (None: same
        user as the trainer).  Ignored when not root.
    """

    wall_seconds: float = 30.0
    cpu_seconds: int = 60
    memory_bytes: int = 4 * _GIB
    file_bytes: int = 64 * _MIB
    max_processes: int = 64
    max_output_chars: int = 1 * _MIB
    isolate_network: bool = True
    run_as_uid: int | None = NOBODY_UID

    def __post_init__(self):
        for field in ("wall_seconds", "cpu_seconds", "memory_bytes", "file_bytes", "max_processes", "max_output_chars"):
            if getattr(self, field) <= 0:
                raise ValueError(f"SandboxLimits.{field} must be positive, got {getattr(self, field)}")


@dataclasses.dataclass(frozen=True)
class CandidateResult:
    """Outcome of one candidate.

    Attributes:
      success: True when every split produced valid probabilities.
      auc_per_split: ROC AUC of each split (empty on failure).
      error: one message for the agent on failure ("" on success).
      seconds: wall-clock seconds the run took.
      network_isolated: whether the candidate ran without a network.
    """

    success: bool
    auc_per_split: tuple[float, ...] = ()
    error: str = ""
    seconds: float = 0.0
    network_isolated: bool = False

    @property
    def mean_auc(self) -> float:
        return float(np.mean(self.auc_per_split)) if self.auc_per_split else float("nan")


def split_indices(num_rows: int, num_splits: int = NUM_SPLITS, test_fraction: float = TEST_FRACTION):
    """Returns [(train_idx, test_idx)] of `train_test_split(random_state=s)`, s = 0..num_splits-1."""
    from sklearn.model_selection import train_test_split

    rows = np.arange(num_rows)
    return [tuple(train_test_split(rows, test_size=test_fraction, random_state=s)) for s in range(num_splits)]


def roc_auc(y_true: np.ndarray, proba: np.ndarray, classes: Sequence[int]) -> float:
    """Returns ROC AUC: positive-class column for 2 classes, one-vs-one macro above.

    Raises ValueError for NaN/inf probabilities or a split with one class.
    """
    from sklearn.metrics import roc_auc_score

    if not np.all(np.isfinite(proba)):
        raise ValueError("predict_proba returned NaN or infinite probabilities")
    if len(classes) == 2:
        return float(roc_auc_score(y_true, proba[:, 1]))
    present = np.unique(y_true)
    scores = proba[:, [list(classes).index(c) for c in present]]
    totals = scores.sum(axis=1, keepdims=True)
    if not np.allclose(totals, 1.0):
        # roc_auc_score needs rows summing to 1 over the classes present;
        # rows that already do are left untouched so that ties stay ties.
        scores = np.where(totals > 0, scores / np.where(totals > 0, totals, 1.0), 1.0 / len(present))
    return float(roc_auc_score(y_true, scores, multi_class="ovo", labels=present))


def scrubbed_environment(workdir: pathlib.Path) -> dict[str, str]:
    """Returns the candidate's environment: nothing from the trainer but PATH basics."""
    single_thread = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(workdir),
        "TMPDIR": str(workdir),
        "LANG": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        **single_thread,
    }


def _kill_group(pgid: int) -> None:
    """Kills every process of the group (and session) `pgid` until none is left."""
    for _ in range(50):
        alive = _members_of(pgid)
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if not alive:
            return
        time.sleep(0.02)


def _members_of(session: int) -> list[int]:
    """Returns pids whose process group or session is `session` (Linux /proc)."""
    members = []
    proc = pathlib.Path("/proc")
    if not proc.is_dir():
        return members
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat_line = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat_line.rsplit(")", 1)[-1].split()
        # fields: state ppid pgrp session ...; a zombie needs no kill.
        if fields[0] != "Z" and session in (int(fields[2]), int(fields[3])):
            members.append(int(entry.name))
    return members


def _fill_workdir(workdir: pathlib.Path, code: str, X: np.ndarray, y: np.ndarray, splits, limits: SandboxLimits) -> None:
    """Writes data.npz (features, split indices, training labels only), the code and job.json."""
    classes = np.unique(y)
    arrays = {"X": np.asarray(X, dtype=np.float64), "classes": classes, "num_splits": np.int64(len(splits))}
    for s, (train, test) in enumerate(splits):
        arrays.update({f"train_{s}": train, f"test_{s}": test, f"y_train_{s}": y[train]})
    np.savez(workdir / "data.npz", **arrays)
    # Model text may hold lone surrogates; they become U+FFFD, never an error here.
    (workdir / "candidate.py").write_text(code, encoding="utf-8", errors="replace")
    job = {
        "cpu_seconds": limits.cpu_seconds,
        "memory_bytes": limits.memory_bytes,
        "file_bytes": limits.file_bytes,
        "max_processes": limits.max_processes,
        "max_output_chars": limits.max_output_chars,
        "isolate_network": limits.isolate_network,
    }
    (workdir / "job.json").write_text(json.dumps(job))


def _drop_to_uid(limits: SandboxLimits, python: str) -> int | None:
    """Returns the uid to run the candidate as, or None to keep the trainer's."""
    if limits.run_as_uid is None or not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    return limits.run_as_uid if interpreter_usable_by(python, limits.run_as_uid) else None


def traversable_by_others(directory: pathlib.Path) -> bool:
    """True when every directory from / down to `directory` lets other users pass."""
    for path in (directory, *directory.parents):
        try:
            if not path.stat().st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    return True


@functools.lru_cache(maxsize=None)
def interpreter_usable_by(python: str, uid: int) -> bool:
    """True when user `uid` can start `python` and import scikit-learn (probed once).

    False e.g. when the interpreter lives under a directory only root may
    enter; the sandbox then runs the candidate as the trainer's user.
    """
    try:
        probe = subprocess.run(
            [python, "-I", "-c", "import numpy, sklearn"],
            cwd="/", env={"PATH": "/usr/bin:/bin"}, user=uid, group=uid, extra_groups=[],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


def evaluate_candidate(
    code: str,
    X: np.ndarray,
    y: np.ndarray,
    limits: SandboxLimits = SandboxLimits(),
    splits=None,
    base_dir: str | os.PathLike | None = None,
    python: str = sys.executable,
) -> CandidateResult:
    """Runs `code` (defining build_model) in the sandbox and returns its scores.

    `splits` defaults to `split_indices(len(y))`.  Never raises for anything
    the candidate does: crashes, timeouts and bad outputs become
    `CandidateResult(success=False, error=...)`.
    """
    start = time.monotonic()
    splits = split_indices(len(y)) if splits is None else splits
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="poad_sandbox_", dir=base_dir))
    try:
        _fill_workdir(workdir, code, X, y, splits, limits)
        uid = _drop_to_uid(limits, python)
        if uid is not None and not traversable_by_others(workdir.parent):
            uid = None  # the unprivileged user could not reach its own directory
        if uid is not None:
            os.chown(workdir, uid, uid)
        with open(workdir / "output.txt", "wb") as output:
            process = subprocess.Popen(
                [python, "-I", str(RUNNER), str(workdir)],
                cwd=workdir,
                env=scrubbed_environment(workdir),
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                **({"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}),
            )
            timed_out = False
            try:
                process.wait(timeout=limits.wall_seconds)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(process.pid)
                process.wait()
        seconds = time.monotonic() - start
        if timed_out:
            return CandidateResult(False, error=f"TimeoutError: the code ran longer than {limits.wall_seconds:g} s", seconds=seconds)
        return _read_result(workdir, y, splits, process.returncode, seconds)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _read_result(workdir: pathlib.Path, y, splits, returncode: int, seconds: float) -> CandidateResult:
    status_file = workdir / "result.json"
    try:
        status = json.loads(status_file.read_text())
    except (OSError, ValueError):
        tail = _tail(workdir / "output.txt")
        reason = _describe_exit(returncode)
        return CandidateResult(False, error=f"the process {reason} without a result" + (f":\n{tail}" if tail else ""), seconds=seconds)
    isolated = bool(status.get("network_isolated", False))
    if not status.get("ok"):
        error = str(status.get("error", "unknown error"))[:ERROR_TAIL_CHARS]
        return CandidateResult(False, error=error, seconds=seconds, network_isolated=isolated)
    classes = [int(c) for c in np.unique(y)]
    try:
        with np.load(workdir / "result.npz") as result:
            aucs = []
            for s, (_, test) in enumerate(splits):
                proba = np.asarray(result[f"proba_{s}"], dtype=np.float64)
                if proba.shape != (len(test), len(classes)):
                    raise ValueError(f"probabilities of split {s} have shape {proba.shape}")
                aucs.append(roc_auc(y[test], proba, classes))
    except (OSError, KeyError, ValueError) as error:
        return CandidateResult(False, error=f"{type(error).__name__}: {error}", seconds=seconds, network_isolated=isolated)
    return CandidateResult(True, tuple(aucs), seconds=seconds, network_isolated=isolated)


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


def _tail(path: pathlib.Path, chars: int = ERROR_TAIL_CHARS) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - chars))
            return handle.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def evaluate_many(
    codes: Sequence[str],
    X: np.ndarray,
    y: np.ndarray,
    limits: SandboxLimits = SandboxLimits(),
    max_workers: int | None = None,
) -> list[CandidateResult]:
    """Returns `evaluate_candidate` of each code, run `max_workers` at a time (threads)."""
    splits = split_indices(len(y))
    workers = max_workers or min(len(codes), os.cpu_count() or 1) or 1
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda code: evaluate_candidate(code, X, y, limits, splits), codes))
