"""Runs generated `build_model` code behind an operating-system boundary and scores it.

`evaluate_candidate(code, X, y, limits)` scores the code on each split in a
fresh `python -I _runner.py` of its own, inside a bubblewrap sandbox of its
own (`envs_py.datasci.isolation`): its own PID, network, IPC and mount
namespaces, an unprivileged uid, a read-only view of the interpreter and a
private tmpfs as working directory.  The splits run one after another and
each sandbox is gone before the next starts, so the code under test sees
only its split's training rows and labels and the test rows' features:
nothing of another split, and nothing left by its own earlier calls.  One
split's job (limits, code, those arrays) goes in through a pipe, so no copy
of the data is ever written to the host's disk; the test-set probabilities
come back through another pipe and this process computes the ROC AUCs.  The
wall clock, one per split (its start, imports, fit and predict), is enforced
here and, by `timeout`, inside each sandbox; the runner adds resource limits
and a Python audit hook as a second layer.  The trainer never imports or executes generated code
itself.

Before the first candidate of a process, a probe program runs through the
same path and must show that it is not root, has no capability, and lives in
its own PID, network and mount namespaces.  When bubblewrap is missing or
the probe fails, candidates are refused (`SandboxUnavailableError`) unless
the user allowed unsandboxed runs explicitly (`SandboxLimits(
allow_unsandboxed=True)` or `$POAD_ALLOW_UNSANDBOXED=1`); each process then
logs a warning once and runs the runner as a plain child process per
split, in a fresh temporary directory, where only the audit hook and the
resource limits apply.  See docs/datasci.md.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import errno
import io
import json
import logging
import os
import pathlib
import platform
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Sequence

import numpy as np

from envs_py.datasci import isolation
from envs_py.datasci.isolation import SandboxUnavailableError

RUNNER = pathlib.Path(__file__).with_name("_runner.py")
NUM_SPLITS = 5
TEST_FRACTION = 0.5
ERROR_TAIL_CHARS = 2000
NOBODY_UID = 65534
# Seconds allowed for a killed sandbox (or runner) to be reaped.
KILL_WAIT_S = 5.0
# Bytes of the result stream beyond the probabilities themselves (status, zip headers).
RESULT_OVERHEAD_BYTES = 1 << 20
READ_CHUNK = 1 << 16
PROBE_TAG = "POAD_SANDBOX_PROBE"
PROBE_WALL_S = 60.0
_GIB = 1 << 30
_MIB = 1 << 20
_log = logging.getLogger(__name__)


__all__ = ["SandboxLimits", "CandidateResult", "SandboxStatus", "SandboxUnavailableError", "evaluate_candidate",
           "evaluate_many", "require_sandbox", "sandbox_status", "split_indices", "roc_auc"]


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Limits of one candidate run.

    Attributes:
      wall_seconds: wall clock of each split's run (its interpreter start,
        imports, fit and predict).  A program that overruns it fails at that
        split; a whole run is bounded by number of splits x wall_seconds.
      cpu_seconds: CPU time (RLIMIT_CPU).
      memory_bytes: address space (RLIMIT_AS).
      file_bytes: largest file the candidate may write (RLIMIT_FSIZE).
      max_processes: RLIMIT_NPROC for the candidate's uid (every process and
        thread of that uid on the machine counts).
      max_output_chars: characters the candidate may print (through Python or
        raw descriptors) before it fails.
      workdir_bytes: size of the candidate's private tmpfs working directory.
      run_as_uid: host uid of the candidate when the trainer is root.
      allow_unsandboxed: run candidates without bubblewrap when it cannot be
        used (unsafe; a warning is logged).  `$POAD_ALLOW_UNSANDBOXED=1` does
        the same.  Has no effect where the sandbox works.
    """

    wall_seconds: float = 30.0
    cpu_seconds: int = 60
    memory_bytes: int = 4 * _GIB
    file_bytes: int = 64 * _MIB
    max_processes: int = 64
    max_output_chars: int = 1 * _MIB
    workdir_bytes: int = 256 * _MIB
    run_as_uid: int = NOBODY_UID
    allow_unsandboxed: bool = False

    def __post_init__(self):
        for field in ("wall_seconds", "cpu_seconds", "memory_bytes", "file_bytes", "max_processes",
                      "max_output_chars", "workdir_bytes", "run_as_uid"):
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
      network_isolated: whether the candidate saw no network interface but loopback.
      sandboxed: whether it ran inside bubblewrap (False only when allowed unsandboxed).
    """

    success: bool
    auc_per_split: tuple[float, ...] = ()
    error: str = ""
    seconds: float = 0.0
    network_isolated: bool = False
    sandboxed: bool = False

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


def scrubbed_environment(workdir: str | os.PathLike) -> dict[str, str]:
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


def job_payload(code: str, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, classes: np.ndarray,
                limits: SandboxLimits, sandboxed: bool) -> bytes:
    """Returns the runner's stdin for one split: one JSON line (limits, code), then an .npz of its arrays.

    The arrays are the split's training rows and labels, its test rows'
    features and the classes of the whole dataset (to align the
    probabilities): nothing that belongs to another split.  The limits are
    the same for every split, so they carry nothing from one to the next.
    """
    job = {
        "cpu_seconds": limits.cpu_seconds,
        "memory_bytes": limits.memory_bytes,
        "file_bytes": limits.file_bytes,
        "max_processes": limits.max_processes,
        "max_output_chars": limits.max_output_chars,
        "isolate_network": not sandboxed,  # bubblewrap already gave it an empty network namespace
        # Model text may hold lone surrogates; they become "?", never an error here.
        "code": code.encode("utf-8", errors="replace").decode("utf-8"),
    }
    buffer = io.BytesIO()
    np.savez(buffer, x_train=np.asarray(x_train, dtype=np.float64), y_train=np.asarray(y_train),
             x_test=np.asarray(x_test, dtype=np.float64), classes=np.asarray(classes))
    return json.dumps(job).encode("ascii") + b"\n" + buffer.getvalue()


# ---------------------------------------------------------------------------
# One run: a child process fed through stdin, read through two capped pipes.


@dataclasses.dataclass
class _Exchange:
    """What came back from one child process."""

    result: bytearray = dataclasses.field(default_factory=bytearray)
    log_tail: bytearray = dataclasses.field(default_factory=bytearray)
    log_bytes: int = 0
    info: bytearray = dataclasses.field(default_factory=bytearray)
    timed_out: bool = False
    overflow: str = ""  # "result" or "log": the stream that passed its cap


def _exchange(process: subprocess.Popen, payload: bytes, deadline: float, result_cap: int, log_cap: int,
              info_fd: int | None) -> _Exchange:
    """Feeds `payload` to stdin and reads stdout (result), stderr (log) and bwrap's info until EOF.

    Stops early at the deadline (`timed_out`) or when a stream passes its cap
    (`overflow` names it); the caller then ends the process.
    """
    got = _Exchange()
    selector = selectors.DefaultSelector()
    pending = memoryview(payload)
    os.set_blocking(process.stdin.fileno(), False)
    selector.register(process.stdin, selectors.EVENT_WRITE, "stdin")
    selector.register(process.stdout, selectors.EVENT_READ, "result")
    selector.register(process.stderr, selectors.EVENT_READ, "log")
    if info_fd is not None:
        selector.register(info_fd, selectors.EVENT_READ, "info")
    try:
        while any(key.data != "stdin" for key in selector.get_map().values()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                got.timed_out = True
                return got
            for key, _ in selector.select(remaining):
                if key.data == "stdin":
                    try:
                        pending = pending[os.write(key.fd, pending[:READ_CHUNK]):]
                    except (BrokenPipeError, BlockingIOError) as error:
                        if isinstance(error, BlockingIOError):
                            continue
                        pending = pending[:0]
                    if not pending:
                        selector.unregister(key.fileobj)
                        process.stdin.close()
                    continue
                data = os.read(key.fd, READ_CHUNK)
                if not data:
                    selector.unregister(key.fileobj)
                    continue
                if key.data == "result":
                    got.result += data
                    if len(got.result) > result_cap:
                        got.overflow = "result"
                        return got
                elif key.data == "log":
                    got.log_bytes += len(data)
                    got.log_tail = (got.log_tail + data)[-4 * ERROR_TAIL_CHARS:]
                    if got.log_bytes > log_cap:
                        got.overflow = "log"
                        return got
                else:
                    got.info += data[:READ_CHUNK]
        return got
    finally:
        selector.close()


def _sandbox_first_pid(info: bytes) -> int | None:
    """Returns the host pid of the sandbox's first process from bwrap's --info-fd JSON, or None."""
    found = re.search(rb'"child-pid"\s*:\s*(\d+)', info)
    return int(found.group(1)) if found else None


def _parent_pid(pid: int) -> int | None:
    try:
        return int(pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _end_sandbox(process: subprocess.Popen, info: bytes) -> None:
    """Kills the sandbox's first process (the kernel then kills its whole PID namespace), then bwrap.

    The pid comes from bwrap; it is signalled through a pidfd, and only after
    checking that it is still bwrap's child, so a reused pid is never hit.
    """
    if process.poll() is not None:
        return  # bwrap returns only after its first process, and so the whole namespace, is gone
    first = _sandbox_first_pid(bytes(info))
    signalled = False
    if first is not None and hasattr(os, "pidfd_open"):
        try:
            handle = os.pidfd_open(first)
        except OSError:
            handle = None
        if handle is not None:
            try:
                if _parent_pid(first) == process.pid:
                    signal.pidfd_send_signal(handle, signal.SIGKILL)
                    signalled = True
            except OSError:
                pass
            finally:
                os.close(handle)
    if signalled:
        try:
            process.wait(timeout=KILL_WAIT_S)
            return
        except subprocess.TimeoutExpired:
            pass
    process.kill()  # --die-with-parent then kills the sandbox's first process, and the kernel the rest
    process.wait()


def _kill_group(pgid: int) -> None:
    """Kills every process of the group (and session) `pgid` until none is left (unsandboxed mode)."""
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


def _run(argv: list[str], payload: bytes, cwd: str, env: dict, deadline: float, result_cap: int, log_cap: int,
         sandboxed: bool, info_pipe: tuple[int, int] | None = None, pass_fds: tuple[int, ...] = ()) -> tuple[int, _Exchange]:
    """Runs one child to its end (or kills it at `deadline`) and returns (exit status, what it sent).

    The write end of `info_pipe` and `pass_fds` are inherited by the child
    and closed here once it has started; the read end is closed at the end.
    """
    info_r = info_pipe[0] if info_pipe else None
    inherited = (*((info_pipe[1],) if info_pipe else ()), *pass_fds)
    try:
        process = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True, close_fds=True, pass_fds=inherited,
        )
    except BaseException:
        for fd in (*inherited, *((info_r,) if info_r is not None else ())):
            os.close(fd)
        raise
    for fd in inherited:
        os.close(fd)
    got = _Exchange()
    try:
        got = _exchange(process, payload, deadline, result_cap, log_cap, info_r)
        if not (got.timed_out or got.overflow):
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                got.timed_out = True
    finally:
        if sandboxed:
            _end_sandbox(process, got.info)
        else:
            _kill_group(process.pid)
            process.wait()
        for stream in (process.stdin, process.stdout, process.stderr):
            stream.close()
        if info_r is not None:
            os.close(info_r)
    return process.returncode, got


def _filter_pipe() -> int:
    """Returns the read end of a pipe that holds `isolation.keyring_filter()` and is closed for writing."""
    read_end, write_end = os.pipe()
    try:
        program = isolation.keyring_filter()  # a few hundred bytes: fits the pipe's buffer
        while program:
            program = program[os.write(write_end, program):]
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    return read_end


def _run_sandboxed(payload: bytes, limits: SandboxLimits, deadline: float, result_cap: int, log_cap: int,
                   python: str) -> tuple[int, _Exchange]:
    """Runs one split's job in a new bubblewrap sandbox, with the keyring filter, and ends it."""
    info_pipe = os.pipe()
    opened = list(info_pipe)
    try:
        seccomp_r = _filter_pipe()
        opened.append(seccomp_r)
        # The inner clock is the same for every split: it tells a split nothing.
        argv = isolation.bwrap_command(python, str(RUNNER), limits.run_as_uid, limits.wall_seconds,
                                       limits.workdir_bytes, info_fd=info_pipe[1], seccomp_fd=seccomp_r)
    except BaseException:
        for fd in opened:
            os.close(fd)
        raise
    env = scrubbed_environment(isolation.SANDBOX_WORKDIR)
    return _run(argv, payload, "/", env, deadline, result_cap, log_cap, True, info_pipe, (seccomp_r,))


def _run_unsandboxed(payload: bytes, deadline: float, result_cap: int, log_cap: int, base_dir,
                     python: str) -> tuple[int, _Exchange]:
    """Runs one split's job as a plain child process in a new temporary directory, removed afterwards."""
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="poad_sandbox_", dir=base_dir))
    try:
        argv = [python, "-I", str(RUNNER), str(workdir)]
        return _run(argv, payload, str(workdir), scrubbed_environment(workdir), deadline, result_cap, log_cap,
                    False)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _result_cap(num_test: int, num_classes: int) -> int:
    """Bytes one split's result stream may hold: its float64 probabilities plus overhead."""
    return num_test * num_classes * 8 + RESULT_OVERHEAD_BYTES


@dataclasses.dataclass(frozen=True)
class _SplitOutcome:
    """What one split's run gave: its AUC, or the error that fails the whole candidate."""

    auc: float = float("nan")
    error: str = ""
    network_isolated: bool = False


def _evaluate(code, X, y, limits, splits, base_dir, python, sandboxed: bool) -> CandidateResult:
    """Scores `code` split by split, each in a fresh runner with a wall clock of its own; stops at the first failure.

    The clock is per split so that the fixed cost of each split (a new
    interpreter importing scikit-learn: 1.3-1.7 s on a loaded 2-core machine)
    does not add up against one budget: an honest program must not time out
    because the machine is busy.  A runaway still stops at its first split.
    """
    start = time.monotonic()
    classes = np.unique(y)
    aucs, isolated, printed = [], True, 0
    for index, (train, test) in enumerate(splits):
        payload = job_payload(code, X[train], y[train], X[test], classes, limits, sandboxed)
        cap = _result_cap(len(test), len(classes))
        log_cap = limits.max_output_chars - printed  # the output limit is the candidate's, over all splits
        deadline = time.monotonic() + limits.wall_seconds
        if sandboxed:
            returncode, got = _run_sandboxed(payload, limits, deadline, cap, log_cap, python)
        else:
            returncode, got = _run_unsandboxed(payload, deadline, cap, log_cap, base_dir, python)
        printed += got.log_bytes
        outcome = _split_outcome(got, returncode, y[test], classes, index, limits, sandboxed)
        isolated = isolated and outcome.network_isolated
        if outcome.error:
            return CandidateResult(False, error=outcome.error, seconds=time.monotonic() - start,
                                   network_isolated=isolated, sandboxed=sandboxed)
        aucs.append(outcome.auc)
    return CandidateResult(True, tuple(aucs), seconds=time.monotonic() - start, network_isolated=isolated,
                           sandboxed=sandboxed)


def _split_outcome(got: _Exchange, returncode: int, y_test, classes, index: int, limits: SandboxLimits,
                   sandboxed: bool) -> _SplitOutcome:
    """Turns one split's exchange into its AUC or the candidate's error."""
    if got.timed_out:
        return _SplitOutcome(error=f"TimeoutError: the code ran longer than {limits.wall_seconds:g} s "
                                   f"on split {index}")
    if got.overflow == "log":
        return _SplitOutcome(error=f"OverflowError: output limit of {limits.max_output_chars} characters exceeded")
    if got.overflow:
        return _SplitOutcome(error=f"the result stream passed {_result_cap(len(y_test), len(classes))} bytes")
    return _read_result(bytes(got.result), bytes(got.log_tail), y_test, classes, index, returncode, sandboxed)


def _read_result(data: bytes, log: bytes, y_test, classes, index: int, returncode: int,
                 sandboxed: bool) -> _SplitOutcome:
    """Scores one runner's .npz against the split's test labels (which never left this process)."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as result:
            status = json.loads(bytes(result["status"]).decode("utf-8"))
            arrays = {name: np.asarray(result[name]) for name in result.files if name == "proba"}
        if not isinstance(status, dict):
            raise ValueError("status is not an object")
    except Exception:  # noqa: BLE001 - anything the candidate could have written on the stream
        tail = log.decode("utf-8", "replace").strip()[-ERROR_TAIL_CHARS:]
        reason = _describe_exit(returncode, sandboxed)
        return _SplitOutcome(error=f"the process {reason} without a result" + (f":\n{tail}" if tail else ""))
    isolated = bool(status.get("network_isolated", False))
    if not status.get("ok"):
        return _SplitOutcome(error=str(status.get("error", "unknown error"))[:ERROR_TAIL_CHARS],
                             network_isolated=isolated)
    labels = [int(c) for c in classes]
    try:
        proba = np.asarray(arrays["proba"], dtype=np.float64)
        if proba.shape != (len(y_test), len(labels)):
            raise ValueError(f"probabilities of split {index} have shape {proba.shape}")
        return _SplitOutcome(auc=roc_auc(y_test, proba, labels), network_isolated=isolated)
    except (KeyError, TypeError, ValueError) as error:
        return _SplitOutcome(error=f"{type(error).__name__}: {error}", network_isolated=isolated)


def _describe_exit(returncode: int, sandboxed: bool = False) -> str:
    # Inside bubblewrap a signal death reaches us as 128 + signal (timeout's and bwrap's convention).
    number = -returncode if returncode < 0 else (returncode - 128 if sandboxed and returncode > 128 else 0)
    if number:
        try:
            return f"was killed by {signal.Signals(number).name}"
        except ValueError:
            return f"was killed by signal {number}"
    return f"exited with code {returncode}"


# ---------------------------------------------------------------------------
# Whether the sandbox holds: a probe through the same path, once per process.

PROBE_CODE = f'''
import ctypes, json, os

def _status(name):
    for line in open("/proc/self/status"):
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].strip()

def _keyring_errno(keyctl):
    # keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING, create): the user keyring outlives the sandbox
    if keyctl is None:
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return 0 if libc.syscall(keyctl, 0, -4, 1) >= 0 else ctypes.get_errno()

raise RuntimeError("{PROBE_TAG} " + json.dumps({{
    "uid": os.getuid(), "uid_map": [[int(n) for n in line.split()] for line in open("/proc/self/uid_map")],
    "pid_ns": os.readlink("/proc/self/ns/pid"), "net_ns": os.readlink("/proc/self/ns/net"),
    "mnt_ns": os.readlink("/proc/self/ns/mnt"),
    "cap_eff": int(_status("CapEff"), 16), "no_new_privs": _status("NoNewPrivs"),
    "etc_shadow_visible": os.path.exists("/etc/shadow"),
    "keyring_errno": _keyring_errno({isolation.keyctl_number()}),
}}))
'''
IDENTITY_UID_MAP = [[0, 0, 4294967295]]


def candidate_host_uid(facts: dict, trainer_uid: int) -> int | None:
    """Returns the candidate's uid on the host as far as it can be known, or None.

    Without a user namespace (the identity map) its uid is the host uid.  In
    a user namespace made by an unprivileged bwrap (not setuid), it is the
    trainer's own uid: an unprivileged process cannot start anything as
    another host user.  A user namespace under a root trainer is not
    expected (bwrap runs privileged there) and gives None.
    """
    if facts.get("uid_map") == IDENTITY_UID_MAP:
        return facts.get("uid")
    return trainer_uid if trainer_uid != 0 else None


@dataclasses.dataclass(frozen=True)
class SandboxStatus:
    """Whether candidates can run sandboxed here.

    Attributes:
      ok: the probe ran inside bubblewrap and every check held.
      reason: why not ("" when ok).
      facts: what the probe reported from inside (uid, namespaces, capabilities).
    """

    ok: bool
    reason: str = ""
    facts: dict = dataclasses.field(default_factory=dict)


def probe_problems(facts: dict, trainer_uid: int, expected_uid: int) -> list[str]:
    """Returns what is wrong with the probe's `facts` compared with this process (empty: the sandbox holds).

    `facts` gets "host_uid" (`candidate_host_uid`) added.
    """
    problems = []
    facts["host_uid"] = candidate_host_uid(facts, trainer_uid)
    if facts["host_uid"] in (0, None) or facts.get("uid") == 0:
        problems.append(f"the candidate runs as uid {facts.get('uid')} (host uid {facts['host_uid']})")
    elif trainer_uid == 0 and facts["host_uid"] != expected_uid:
        problems.append(f"the candidate runs as host uid {facts['host_uid']}, not {expected_uid}")
    for kind in ("pid", "net", "mnt"):
        if facts.get(f"{kind}_ns") == os.readlink(f"/proc/self/ns/{kind}"):
            problems.append(f"the candidate shares the trainer's {kind} namespace")
    if facts.get("cap_eff") != 0:
        problems.append(f"the candidate has capabilities {facts.get('cap_eff')}")
    if facts.get("no_new_privs") != "1":
        problems.append("no_new_privs is not set")
    if facts.get("etc_shadow_visible") is not False:
        problems.append("the candidate sees /etc/shadow")
    keyring = facts.get("keyring_errno")
    if keyring != errno.EPERM:
        detail = f"keyctl errno {keyring}" if keyring is not None else f"keyctl's number on {platform.machine()} unknown"
        problems.append(f"the candidate's kernel keyrings are not closed ({detail})")
    return problems


def run_probe(python: str = sys.executable, run_as_uid: int = NOBODY_UID) -> SandboxStatus:
    """Runs the probe program as a candidate inside bubblewrap and checks what it reports."""
    X = np.arange(8, dtype=np.float64).reshape(4, 2)
    y = np.array([0, 1, 0, 1])
    splits = [(np.array([0, 1]), np.array([2, 3]))]
    limits = SandboxLimits(wall_seconds=PROBE_WALL_S, run_as_uid=run_as_uid)
    try:
        result = _evaluate(PROBE_CODE, X, y, limits, splits, None, python, sandboxed=True)
    except (SandboxUnavailableError, OSError) as error:
        return SandboxStatus(False, str(error))
    marker = f"RuntimeError: {PROBE_TAG} "
    if not result.error.startswith(marker):
        return SandboxStatus(False, f"the sandbox probe did not run: {result.error.strip()[:500]}")
    facts = json.loads(result.error[len(marker):])
    problems = probe_problems(facts, os.geteuid(), run_as_uid)
    return SandboxStatus(not problems, "; ".join(problems), facts)


_status_lock = threading.Lock()
_statuses: dict[tuple[str, int], SandboxStatus] = {}
_warned_unsandboxed = False


def sandbox_status(python: str = sys.executable, run_as_uid: int = NOBODY_UID) -> SandboxStatus:
    """Returns `run_probe(python, run_as_uid)`, probed once per process."""
    key = (python, run_as_uid)
    with _status_lock:
        if key not in _statuses:
            _statuses[key] = run_probe(python, run_as_uid)
        return _statuses[key]


def require_sandbox(limits: SandboxLimits = SandboxLimits(), python: str = sys.executable) -> bool:
    """Returns True when candidates will run in the sandbox, False when explicitly allowed without it.

    Raises SandboxUnavailableError when the sandbox does not hold and neither
    `limits.allow_unsandboxed` nor `$POAD_ALLOW_UNSANDBOXED` allows running
    without it.  The unsandboxed case logs a warning once per process.
    """
    global _warned_unsandboxed
    status = sandbox_status(python, limits.run_as_uid)
    if status.ok:
        return True
    if not (limits.allow_unsandboxed or isolation.allow_unsandboxed_from_env()):
        raise SandboxUnavailableError(
            f"refusing to run model-written code without the sandbox: {status.reason}. Install bubblewrap "
            f"(scripts/setup.sh as root, or apt-get install bubblewrap), or set {isolation.ALLOW_UNSANDBOXED_ENV}=1 "
            "or --config.env.kwargs.allow_unsandboxed=True to run it unsandboxed at your own risk"
        )
    with _status_lock:
        if not _warned_unsandboxed:
            _warned_unsandboxed = True
            _log.warning("WARNING: model-written code runs WITHOUT the sandbox (%s); only the audit hook and "
                         "resource limits apply, so it can read, write and signal as this user", status.reason)
    return False


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

    `splits` defaults to `split_indices(len(y))`.  `base_dir` holds the
    temporary directory of the unsandboxed mode only.  Never raises for
    anything the candidate does: crashes, timeouts and bad outputs become
    `CandidateResult(success=False, error=...)`.  Raises
    SandboxUnavailableError when the sandbox does not hold here (see
    `require_sandbox`).
    """
    splits = split_indices(len(y)) if splits is None else splits
    sandboxed = require_sandbox(limits, python)
    return _evaluate(code, X, y, limits, splits, base_dir, python, sandboxed)


def evaluate_many(
    codes: Sequence[str],
    X: np.ndarray,
    y: np.ndarray,
    limits: SandboxLimits = SandboxLimits(),
    max_workers: int | None = None,
) -> list[CandidateResult]:
    """Returns `evaluate_candidate` of each code, run `max_workers` at a time (threads)."""
    splits = split_indices(len(y))
    require_sandbox(limits)
    workers = max_workers or min(len(codes), os.cpu_count() or 1) or 1
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda code: evaluate_candidate(code, X, y, limits, splits), codes))
