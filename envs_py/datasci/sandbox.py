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

import atexit
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
import math
import select
import selectors
import shutil
import signal
import socket
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
# Seconds a warm sandbox may take to start (bwrap, the interpreter, numpy and scikit-learn's core) before its
# first split's clock starts; a sandbox that does not start in time fails the program that started it.
START_WALL_S = 60.0
_GIB = 1 << 30
_MIB = 1 << 20
# The warm sandbox's own /sandbox (the zygote's); each split mounts its own tmpfs of limits.workdir_bytes.
DEFAULT_WORKDIR_BYTES = 1 * _MIB
_log = logging.getLogger(__name__)


__all__ = ["SandboxLimits", "CandidateResult", "SandboxStatus", "SandboxUnavailableError", "WarmSession",
           "evaluate_candidate", "evaluate_many", "require_sandbox", "sandbox_status", "shared_session",
           "close_shared_sessions", "split_indices", "roc_auc"]


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
      warm: score a program in one sandbox whose zygote imports scikit-learn
        once and forks a freshly isolated process per split (the default);
        False gives each split a sandbox and an interpreter of its own (the
        cold path, as before).  Unsandboxed runs are always cold.
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
    warm: bool = True

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
      splits_run: how many splits were started (each had its own wall clock).
      warm: whether the warm sandbox (a zygote forking each split) scored it.
      start_seconds: seconds this program waited for a warm sandbox to start
        (bounded by START_WALL_S; 0 in a kept sandbox already started, and
        on the cold path, where each split's clock covers its start).
    """

    success: bool
    auc_per_split: tuple[float, ...] = ()
    error: str = ""
    seconds: float = 0.0
    network_isolated: bool = False
    sandboxed: bool = False
    splits_run: int = 0
    warm: bool = False
    start_seconds: float = 0.0

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
    status: bytearray = dataclasses.field(default_factory=bytearray)  # the warm sandbox's report of the split
    background: bytearray = dataclasses.field(default_factory=bytearray)  # the tail of the zygote's own stderr
    ended: list = dataclasses.field(default_factory=list)  # descriptors that reached their end


def _exchange(process: subprocess.Popen, payload: bytes, deadline: float, result_cap: int, log_cap: int,
              info_fd: int | None) -> _Exchange:
    """Feeds `payload` to stdin and reads stdout (result), stderr (log) and bwrap's info until EOF.

    Stops early at the deadline (`timed_out`) or when a stream passes its cap
    (`overflow` names it); the caller then ends the process.
    """
    extra = {} if info_fd is None else {info_fd: "info"}
    return _exchange_streams(process.stdin, process.stdout, process.stderr, payload, deadline, result_cap, log_cap,
                             extra)


def _exchange_streams(stdin, stdout, stderr, payload: bytes, deadline: float, result_cap: int, log_cap: int,
                      extra: dict, background: dict | None = None) -> _Exchange:
    """`_exchange` on any three streams; `extra` {fd: name} are read into `got.info` ("info") or `got.status`.

    The exchange ends when every stream but stdin and `background` ({fd:
    name}, read into `got.background` but never waited for) has reached its end.
    """
    got = _Exchange()
    selector = selectors.DefaultSelector()
    pending = memoryview(payload)
    os.set_blocking(stdin.fileno(), False)
    selector.register(stdin, selectors.EVENT_WRITE, "stdin")
    selector.register(stdout, selectors.EVENT_READ, "result")
    selector.register(stderr, selectors.EVENT_READ, "log")
    for fd, name in extra.items():
        selector.register(fd, selectors.EVENT_READ, name)
    for fd in background or {}:
        selector.register(fd, selectors.EVENT_READ, "background")
    try:
        while any(key.data not in ("stdin", "background") for key in selector.get_map().values()):
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
                        stdin.close()
                    continue
                data = os.read(key.fd, READ_CHUNK)
                if not data:
                    selector.unregister(key.fileobj)
                    got.ended.append(key.fd)
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
                elif key.data == "info":
                    got.info += data[:READ_CHUNK]
                elif key.data == "background":
                    got.background = (got.background + data)[-4 * ERROR_TAIL_CHARS:]
                else:
                    got.status += data[:READ_CHUNK]
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


class _WarmSandbox:
    """One bubblewrap sandbox whose zygote has imported numpy and scikit-learn and forks a fresh split per request.

    The zygote (`_runner.py --zygote`) never reads a job and never runs
    candidate code.  Each request carries four new descriptors, passed over
    the control socket: the split's job pipe, result pipe, log pipe and a
    status socket.  The zygote forks a watcher; the watcher makes a new PID
    namespace whose first process makes new mount, IPC, network and UTS
    namespaces, a fresh /proc and a fresh tmpfs working directory, and forks
    the candidate's process, which drops its privileges and reads its own job.
    The split's processes hold only that split's descriptors, so the streams
    reach their end when its namespace is gone, and the watcher's status
    report comes after that.  `lifetime_s` is the clock of the whole sandbox
    (the `timeout` around the zygote); each split has its own clock too.
    """

    def __init__(self, python: str, run_as_uid: int, lifetime_s: float, deadline: float):
        self.run_as_uid = run_as_uid
        self.expires = time.monotonic() + lifetime_s
        self.process = None
        self.info = b""
        self.zygote_log = bytearray()
        self._release = threading.Event()
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        info_r, info_w = os.pipe()
        seccomp_r = None
        try:
            seccomp_r = _filter_pipe()
            argv = isolation.bwrap_command(python, str(RUNNER), run_as_uid, lifetime_s, DEFAULT_WORKDIR_BYTES,
                                           info_fd=info_w, seccomp_fd=seccomp_r, zygote_fd=theirs.fileno())
            self._start(argv, (info_w, seccomp_r, theirs.fileno()))
        except BaseException:
            self.control.close()
            os.close(info_r)
            raise
        finally:
            theirs.close()
            os.close(info_w)
            if seccomp_r is not None:
                os.close(seccomp_r)
        try:
            self.info = _read_to_end(info_r, deadline)  # bwrap's JSON: the host pid of the sandbox's first process
        finally:
            os.close(info_r)
        self.ready = False
        self._ready_lock = threading.Lock()

    def wait_ready(self, deadline: float) -> bool:
        """Waits until the zygote has imported numpy and scikit-learn (its "ready"), or the deadline."""
        with self._ready_lock:  # one reader of the control socket; the others find `ready` set
            return self._wait_ready(deadline)

    def _wait_ready(self, deadline: float) -> bool:
        while not self.ready and time.monotonic() < deadline:
            if not select.select([self.control], [], [], max(0.0, deadline - time.monotonic()))[0]:
                break
            try:
                message = self.control.recv(64)
            except OSError:
                message = b""
            if message != b"ready":
                break  # the zygote is gone
            self.ready = True
        return self.ready

    def _start(self, argv: list[str], inherited: tuple[int, ...]) -> None:
        """Starts bwrap from a thread of its own that lives until `close`.

        bwrap's --die-with-parent follows the thread that started it: started
        from a pool's worker, the sandbox would die with that thread while
        other threads still use it.  The keeper thread ends only after close.
        """
        started = threading.Event()
        failure = []

        def keep():
            try:
                self.process = subprocess.Popen(
                    argv, cwd="/", env=scrubbed_environment(isolation.SANDBOX_WORKDIR), stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
                    pass_fds=inherited)
            except BaseException as error:  # noqa: BLE001 - handed to the starting thread
                failure.append(error)
                return
            finally:
                started.set()
            self._release.wait()

        threading.Thread(target=keep, name="poad-warm-sandbox", daemon=True).start()
        started.wait()
        if failure:
            raise failure[0]

    def run_split(self, payload: bytes, limits: SandboxLimits, deadline: float, result_cap: int,
                  log_cap: int) -> tuple[int | None, _Exchange]:
        """Runs one split's job in a fresh split of this sandbox; returns (its exit status or None, what it sent).

        A split that overruns its clock or a cap is killed (its whole PID
        namespace) before this returns; when that cannot be confirmed the
        sandbox is ended (`alive` turns False).
        """
        pipes = [os.pipe() for _ in range(3)]
        (job_r, job_w), (result_r, result_w), (log_r, log_w) = pipes
        status, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        request = {"inner_seconds": math.ceil(limits.wall_seconds) + isolation.INNER_CLOCK_SLACK_S,
                   "workdir_bytes": limits.workdir_bytes}
        try:
            socket.send_fds(self.control, [json.dumps(request).encode()], [job_r, result_w, log_w, theirs.fileno()])
        except OSError:
            pass  # the zygote is gone: the streams below end at once and the split has no result
        finally:
            for fd in (job_r, result_w, log_w):
                os.close(fd)
            theirs.close()
        streams = [open(job_w, "wb", buffering=0), open(result_r, "rb", buffering=0), open(log_r, "rb", buffering=0)]
        background = {self.process.stderr.fileno(): "zygote"} if self.process.stderr is not None else {}
        try:
            got = _exchange_streams(*streams, payload, deadline, result_cap, log_cap, {status.fileno(): "status"},
                                    background)
            self._keep_zygote_log(got)
            if got.timed_out or got.overflow:
                self._kill_split(status, got)
        finally:
            for stream in streams:
                stream.close()
            status.close()
        returncode = _reported_status(got.status)
        if returncode is None:
            self.end()  # no report: the watcher is gone, and so nothing shows that the split's namespace is
        return returncode, got

    def _keep_zygote_log(self, got: _Exchange) -> None:
        self.zygote_log = (self.zygote_log + got.background)[-4 * ERROR_TAIL_CHARS:]
        if self.process.stderr is not None and self.process.stderr.fileno() in got.ended:
            self.process.stderr.close()
            self.process.stderr = None

    def _kill_split(self, status: socket.socket, got: _Exchange) -> None:
        """Asks the split's watcher to kill its namespace and waits for its report; ends the sandbox without one."""
        try:
            status.send(b"k")
        except OSError:
            pass
        deadline = time.monotonic() + KILL_WAIT_S
        while time.monotonic() < deadline:
            ready, _, _ = select.select([status], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            try:
                data = status.recv(READ_CHUNK)
            except OSError:
                data = b""
            if not data:
                break
            got.status += data
        if _reported_status(got.status) is None:
            self.end()  # the watcher did not report that the split's namespace is gone: end the whole sandbox

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def end(self) -> None:
        """Kills the whole sandbox at once."""
        if self.process is not None:
            _end_sandbox(self.process, self.info)

    def close(self) -> None:
        """Ends the sandbox at once and waits for bwrap (no split runs any more; the zygote may be importing)."""
        self.control.close()
        try:
            if self.process is None:
                return
            self.end()
            if self.process.stderr is not None:
                self.process.stderr.close()
                self.process.stderr = None
        finally:
            self._release.set()


def _reported_status(report: bytes) -> int | None:
    """The exit status in a split watcher's report, or None when there is no valid report."""
    try:
        return int(json.loads(bytes(report))["returncode"])
    except (ValueError, KeyError, TypeError):
        return None


def _read_to_end(fd: int, deadline: float) -> bytes:
    """Reads `fd` to its end or until the deadline."""
    data = bytearray()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            return bytes(data)
        chunk = os.read(fd, READ_CHUNK)
        if not chunk:
            return bytes(data)
        data += chunk


def _evaluate_warm(code, X, y, limits, splits, python, session: "WarmSession | None" = None) -> CandidateResult:
    """Scores `code` split by split in a warm sandbox (`_WarmSandbox`); stops at the first failure.

    The sandbox is the session's (shared, kept) or, without one, this
    program's own, ended before this returns.  Each split has its own wall
    clock, as on the cold path; the first one also covers the sandbox's start
    and the zygote's imports when they happen for this program.
    """
    start = time.monotonic()
    classes = np.unique(y)
    aucs, isolated, printed = [], True, 0
    budget = START_WALL_S + len(splits) * (math.ceil(limits.wall_seconds) + isolation.INNER_CLOCK_SLACK_S) + KILL_WAIT_S
    if session is None:
        warm = _WarmSandbox(python, limits.run_as_uid, budget, start + START_WALL_S)
    else:
        warm = session._acquire(limits.run_as_uid, budget, start + START_WALL_S)
    try:
        ready = warm.wait_ready(start + START_WALL_S)
        started = time.monotonic() - start
        if not ready:
            tail = bytes(warm.zygote_log).decode("utf-8", "replace").strip()[-ERROR_TAIL_CHARS:]
            return CandidateResult(False, error=f"TimeoutError: the sandbox did not start within {START_WALL_S:g} s"
                                   + (f":\n{tail}" if tail else ""), seconds=started, sandboxed=True, warm=True,
                                   start_seconds=started)
        for index, (train, test) in enumerate(splits):
            payload = job_payload(code, X[train], y[train], X[test], classes, limits, True)
            cap = _result_cap(len(test), len(classes))
            log_cap = limits.max_output_chars - printed
            deadline = time.monotonic() + limits.wall_seconds
            returncode, got = warm.run_split(payload, limits, deadline, cap, log_cap)
            printed += got.log_bytes
            if returncode is None and not (got.timed_out or got.overflow):
                got.log_tail += b"\n" + bytes(warm.zygote_log)
            outcome = _split_outcome(got, returncode, y[test], classes, index, limits, True)
            isolated = isolated and outcome.network_isolated
            if outcome.error:
                return CandidateResult(False, error=outcome.error, seconds=time.monotonic() - start,
                                       network_isolated=isolated, sandboxed=True, splits_run=index + 1, warm=True,
                                       start_seconds=started)
            aucs.append(outcome.auc)
    finally:
        if session is None:
            warm.close()
        else:
            session._release(warm)
    return CandidateResult(True, tuple(aucs), seconds=time.monotonic() - start, network_isolated=isolated,
                           sandboxed=True, splits_run=len(splits), warm=True, start_seconds=started)


class WarmSession:
    """Keeps a warm sandbox between programs, so that the zygote's imports are paid once for many programs.

    Thread-safe: programs scored at the same time share the sandbox, each
    split in namespaces of its own.  The sandbox ends `idle_s` after its last
    program, at `close`, and when its clock (`lifetime_s`) would not cover
    the next program (a new one starts then).  Each program's splits are
    isolated exactly as with a sandbox of its own: the zygote never runs
    candidate code and never holds a job.
    """

    def __init__(self, python: str = sys.executable, idle_s: float = 2.0, lifetime_s: float = 3600.0):
        self.python, self.idle_s, self.lifetime_s = python, float(idle_s), float(lifetime_s)
        self._lock = threading.Lock()
        self._current: _WarmSandbox | None = None
        self._users: dict[int, int] = {}  # id(sandbox) -> programs using it
        self._retired: list[_WarmSandbox] = []
        self._timer: threading.Timer | None = None
        self._closed = False

    def evaluate(self, code: str, X: np.ndarray, y: np.ndarray, limits: SandboxLimits = SandboxLimits(),
                 splits=None) -> CandidateResult:
        """`evaluate_candidate` through this session's sandbox (the cold or unsandboxed path where it applies)."""
        return evaluate_candidate(code, X, y, limits, splits, python=self.python, session=self)

    def _acquire(self, run_as_uid: int, budget_s: float, deadline: float) -> _WarmSandbox:
        with self._lock:
            if self._closed:
                raise RuntimeError("the warm session is closed")
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            current = self._current
            if current is not None and not (current.alive and current.run_as_uid == run_as_uid
                                            and time.monotonic() + budget_s < current.expires):
                self._retire(current)
                current = self._current = None
            if current is None:
                current = self._current = _WarmSandbox(self.python, run_as_uid, max(self.lifetime_s, budget_s),
                                                       deadline)
            self._users[id(current)] = self._users.get(id(current), 0) + 1
            return current

    def _release(self, sandbox: _WarmSandbox) -> None:
        to_close = []
        with self._lock:
            self._users[id(sandbox)] -= 1
            if self._users[id(sandbox)] == 0:
                if sandbox is not self._current or not sandbox.alive:
                    del self._users[id(sandbox)]
                    to_close.append(sandbox)
                    if sandbox is self._current:
                        self._current = None
                    if sandbox in self._retired:
                        self._retired.remove(sandbox)
                elif self.idle_s <= 0:
                    self._current = None
                    del self._users[id(sandbox)]
                    to_close.append(sandbox)
                else:
                    self._timer = threading.Timer(self.idle_s, self._close_if_idle, args=(sandbox,))
                    self._timer.daemon = True
                    self._timer.start()
        for sandbox in to_close:
            sandbox.close()

    def _retire(self, sandbox: _WarmSandbox) -> None:
        """(lock held) `sandbox` takes no new program; it closes when its last one ends."""
        if self._users.get(id(sandbox), 0) == 0:
            self._users.pop(id(sandbox), None)
            threading.Thread(target=sandbox.close, daemon=True).start()
        else:
            self._retired.append(sandbox)

    def _close_if_idle(self, sandbox: _WarmSandbox) -> None:
        with self._lock:
            if sandbox is not self._current or self._users.get(id(sandbox), 0):
                return
            self._current = None
            self._users.pop(id(sandbox), None)
        sandbox.close()

    def close(self) -> None:
        """Ends the session's sandbox now (programs still running on it fail); the session takes no more."""
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            boxes = [box for box in (self._current, *self._retired) if box is not None]
            self._current, self._retired, self._users = None, [], {}
        for box in boxes:
            box.close()

    def __enter__(self) -> "WarmSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_shared_lock = threading.Lock()
_shared_sessions: dict[str, WarmSession] = {}


def shared_session(python: str = sys.executable) -> WarmSession:
    """The process's warm session for `python` (DataSciEnv's): its sandbox ends 2 s after its last program."""
    with _shared_lock:
        session = _shared_sessions.get(python)
        if session is None or session._closed:
            session = _shared_sessions[python] = WarmSession(python)
        return session


def close_shared_sessions() -> None:
    """Ends every shared warm session's sandbox now (at exit, and for tests that count processes)."""
    with _shared_lock:
        sessions = list(_shared_sessions.values())
        _shared_sessions.clear()
    for session in sessions:
        session.close()


atexit.register(close_shared_sessions)


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
                                   network_isolated=isolated, sandboxed=sandboxed, splits_run=index + 1)
        aucs.append(outcome.auc)
    return CandidateResult(True, tuple(aucs), seconds=time.monotonic() - start, network_isolated=isolated,
                           sandboxed=sandboxed, splits_run=len(splits))


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


def _describe_exit(returncode: int | None, sandboxed: bool = False) -> str:
    if returncode is None:
        return "ended with its sandbox"
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


def run_probe(python: str = sys.executable, run_as_uid: int = NOBODY_UID, warm: bool = True) -> SandboxStatus:
    """Runs the probe program as a candidate inside bubblewrap (warm or cold path) and checks what it reports."""
    X = np.arange(8, dtype=np.float64).reshape(4, 2)
    y = np.array([0, 1, 0, 1])
    splits = [(np.array([0, 1]), np.array([2, 3]))]
    limits = SandboxLimits(wall_seconds=PROBE_WALL_S, run_as_uid=run_as_uid, warm=warm)
    try:
        if warm:
            result = _evaluate_warm(PROBE_CODE, X, y, limits, splits, python)
        else:
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
_statuses: dict[tuple[str, int, bool], SandboxStatus] = {}
_warned_unsandboxed = False
_warned_cold = False


def sandbox_status(python: str = sys.executable, run_as_uid: int = NOBODY_UID, warm: bool = True) -> SandboxStatus:
    """Returns `run_probe(python, run_as_uid, warm)`, probed once per process."""
    key = (python, run_as_uid, warm)
    with _status_lock:
        if key not in _statuses:
            _statuses[key] = run_probe(python, run_as_uid, warm)
        return _statuses[key]


def _sandbox_mode(limits: SandboxLimits, python: str) -> str:
    """Returns "warm", "cold" or "none" (unsandboxed, explicitly allowed); raises as `require_sandbox` does.

    The warm path is used when asked for and its probe holds; where it does
    not (the kernel refuses the zygote its mounts, say) but the cold path
    holds, each split gets a sandbox of its own, with a warning once.
    """
    global _warned_cold
    if limits.warm:
        status = sandbox_status(python, limits.run_as_uid, warm=True)
        if status.ok:
            return "warm"
    cold = dataclasses.replace(limits, warm=False)
    if not require_sandbox(cold, python):
        return "none"
    if limits.warm:
        with _status_lock:
            if not _warned_cold:
                _warned_cold = True
                _log.warning("the warm sandbox does not hold here (%s); each split gets a sandbox and an "
                             "interpreter of its own (slower)", status.reason)
    return "cold"


def require_sandbox(limits: SandboxLimits = SandboxLimits(), python: str = sys.executable) -> bool:
    """Returns True when candidates will run in the sandbox, False when explicitly allowed without it.

    Raises SandboxUnavailableError when the sandbox does not hold and neither
    `limits.allow_unsandboxed` nor `$POAD_ALLOW_UNSANDBOXED` allows running
    without it.  The unsandboxed case logs a warning once per process.
    """
    global _warned_unsandboxed
    status = sandbox_status(python, limits.run_as_uid, warm=limits.warm)
    if status.ok:
        return True
    if limits.warm and sandbox_status(python, limits.run_as_uid, warm=False).ok:
        return True  # the cold path holds: `_sandbox_mode` takes it
    if limits.warm:
        status = sandbox_status(python, limits.run_as_uid, warm=False)
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
    session: WarmSession | None = None,
) -> CandidateResult:
    """Runs `code` (defining build_model) in the sandbox and returns its scores.

    `splits` defaults to `split_indices(len(y))`.  `base_dir` holds the
    temporary directory of the unsandboxed mode only.  On the warm path
    (`limits.warm`, the default) the program gets a warm sandbox of its own,
    ended before this returns, unless `session` lends it one that is kept
    between programs (`WarmSession`).  Never raises for
    anything the candidate does: crashes, timeouts and bad outputs become
    `CandidateResult(success=False, error=...)`.  Raises
    SandboxUnavailableError when the sandbox does not hold here (see
    `require_sandbox`).
    """
    splits = split_indices(len(y)) if splits is None else splits
    mode = _sandbox_mode(limits, python)
    if mode == "warm":
        return _evaluate_warm(code, X, y, limits, splits, python, session)
    return _evaluate(code, X, y, limits, splits, base_dir, python, sandboxed=mode == "cold")


def evaluate_many(
    codes: Sequence[str],
    X: np.ndarray,
    y: np.ndarray,
    limits: SandboxLimits = SandboxLimits(),
    max_workers: int | None = None,
) -> list[CandidateResult]:
    """Returns `evaluate_candidate` of each code, run `max_workers` at a time (threads).

    On the warm path the programs share one warm sandbox (`WarmSession`),
    ended before this returns.
    """
    splits = split_indices(len(y))
    require_sandbox(limits)
    workers = max_workers or min(len(codes), os.cpu_count() or 1) or 1
    with WarmSession(idle_s=0.0 if len(codes) <= 1 else 60.0) as session, \
            concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda code: evaluate_candidate(code, X, y, limits, splits, session=session), codes))
