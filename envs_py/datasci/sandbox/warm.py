"""The warm path: one sandbox whose zygote imports scikit-learn once and forks a freshly isolated split per request.

`WarmSandbox` is one such sandbox (its start, a split's run and kill, its
end); `evaluate_warm` scores a program split by split in one; `WarmKeeper`
keeps one between programs (the base of the public `WarmSession`).
"""

from __future__ import annotations

import json
import math
import os
import select
import socket
import subprocess
import sys
import threading
import time

import numpy as np

from envs_py.datasci import isolation
from envs_py.datasci.sandbox.limits import (ERROR_TAIL_CHARS, RUNNER, CandidateResult, SandboxLimits,
                                            scrubbed_environment)
from envs_py.datasci.sandbox.pipes import (READ_CHUNK, Exchange, exchange_streams, filter_pipe, job_payload,
                                           read_to_end, reported_status)
from envs_py.datasci.sandbox.reaping import KILL_WAIT_S, end_sandbox
from envs_py.datasci.sandbox.scoring import result_cap_bytes, split_outcome

# Seconds a warm sandbox may take to start (bwrap, the interpreter, numpy and scikit-learn's core) before its
# first split's clock starts; a sandbox that does not start in time fails the program that started it.
START_WALL_S = 60.0

# The warm sandbox's own /sandbox (the zygote's); each split mounts its own tmpfs of limits.workdir_bytes.
DEFAULT_WORKDIR_BYTES = 1 << 20


class WarmSandbox:
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
            seccomp_r = filter_pipe()
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
            self.info = read_to_end(info_r, deadline)  # bwrap's JSON: the host pid of the sandbox's first process
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
                  log_cap: int) -> tuple[int | None, Exchange]:
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
            got = exchange_streams(*streams, payload, deadline, result_cap, log_cap, {status.fileno(): "status"},
                                    background)
            self._keep_zygote_log(got)
            if got.timed_out or got.overflow:
                self._kill_split(status, got)
        finally:
            for stream in streams:
                stream.close()
            status.close()
        returncode = reported_status(got.status)
        if returncode is None:
            self.end()  # no report: the watcher is gone, and so nothing shows that the split's namespace is
        return returncode, got

    def _keep_zygote_log(self, got: Exchange) -> None:
        self.zygote_log = (self.zygote_log + got.background)[-4 * ERROR_TAIL_CHARS:]
        if self.process.stderr is not None and self.process.stderr.fileno() in got.ended:
            self.process.stderr.close()
            self.process.stderr = None

    def _kill_split(self, status: socket.socket, got: Exchange) -> None:
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
        if reported_status(got.status) is None:
            self.end()  # the watcher did not report that the split's namespace is gone: end the whole sandbox

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def end(self) -> None:
        """Kills the whole sandbox at once."""
        if self.process is not None:
            end_sandbox(self.process, self.info)

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


def evaluate_warm(code, X, y, limits, splits, python, keeper: "WarmKeeper | None" = None) -> CandidateResult:
    """Scores `code` split by split in a warm sandbox (`WarmSandbox`); stops at the first failure.

    The sandbox is the keeper's (a session's: shared, kept) or, without
    one, this program's own, ended before this returns.  Each split has its own wall
    clock, as on the cold path; the first one also covers the sandbox's start
    and the zygote's imports when they happen for this program.
    """
    start = time.monotonic()
    classes = np.unique(y)
    aucs, isolated, printed = [], True, 0
    budget = START_WALL_S + len(splits) * (math.ceil(limits.wall_seconds) + isolation.INNER_CLOCK_SLACK_S) + KILL_WAIT_S
    if keeper is None:
        warm = WarmSandbox(python, limits.run_as_uid, budget, start + START_WALL_S)
    else:
        warm = keeper.acquire(limits.run_as_uid, budget, start + START_WALL_S)
    try:
        ready = warm.wait_ready(start + START_WALL_S)
        started = time.monotonic() - start
        if not ready:
            tail = bytes(warm.zygote_log).decode("utf-8", "replace").strip()[-ERROR_TAIL_CHARS:]
            return CandidateResult(False, error=f"TimeoutError: the sandbox did not start within {START_WALL_S:g} s"
                                   + (f":\n{tail}" if tail else ""), seconds=started, sandboxed=True, warm=True,
                                   start_seconds=started, failure_stage="limit")
        for index, (train, test) in enumerate(splits):
            payload = job_payload(code, X[train], y[train], X[test], classes, limits, True)
            cap = result_cap_bytes(len(test), len(classes))
            log_cap = limits.max_output_chars - printed
            deadline = time.monotonic() + limits.wall_seconds
            returncode, got = warm.run_split(payload, limits, deadline, cap, log_cap)
            printed += got.log_bytes
            if returncode is None and not (got.timed_out or got.overflow):
                got.log_tail += b"\n" + bytes(warm.zygote_log)
            outcome = split_outcome(got, returncode, y[test], classes, index, limits, True)
            isolated = isolated and outcome.network_isolated
            if outcome.error:
                return CandidateResult(False, error=outcome.error, seconds=time.monotonic() - start,
                                       network_isolated=isolated, sandboxed=True, splits_run=index + 1, warm=True,
                                       start_seconds=started, failure_stage=outcome.stage)
            aucs.append(outcome.auc)
    finally:
        if keeper is None:
            warm.close()
        else:
            keeper.release(warm)
    return CandidateResult(True, tuple(aucs), seconds=time.monotonic() - start, network_isolated=isolated,
                           sandboxed=True, splits_run=len(splits), warm=True, start_seconds=started)


class WarmKeeper:
    """Keeps a warm sandbox between programs (`acquire` it for a program, `release` it after): `WarmSession`'s keeping.

    Thread-safe: programs that hold the sandbox at the same time share it.
    The sandbox ends `idle_s` after its last program, at `close`, and when
    its clock (`lifetime_s`) would not cover the next program (a new one
    starts then; the old one closes when its last program ends).
    """

    def __init__(self, python: str = sys.executable, idle_s: float = 2.0, lifetime_s: float = 3600.0):
        self.python, self.idle_s, self.lifetime_s = python, float(idle_s), float(lifetime_s)
        self._lock = threading.Lock()
        self._current: WarmSandbox | None = None
        self._users: dict[int, int] = {}  # id(sandbox) -> programs using it
        self._retired: list[WarmSandbox] = []
        self._timer: threading.Timer | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def acquire(self, run_as_uid: int, budget_s: float, deadline: float) -> WarmSandbox:
        """The kept sandbox for one more program (a new one if it is gone, another uid's, or too old)."""
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
                current = self._current = WarmSandbox(self.python, run_as_uid, max(self.lifetime_s, budget_s),
                                                      deadline)
            self._users[id(current)] = self._users.get(id(current), 0) + 1
            return current

    def release(self, sandbox: WarmSandbox) -> None:
        """One program fewer on `sandbox`: closed now if it is retired or dead, else `idle_s` after its last."""
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

    def _retire(self, sandbox: WarmSandbox) -> None:
        """(lock held) `sandbox` takes no new program; it closes when its last one ends."""
        if self._users.get(id(sandbox), 0) == 0:
            self._users.pop(id(sandbox), None)
            threading.Thread(target=sandbox.close, daemon=True).start()
        else:
            self._retired.append(sandbox)

    def _close_if_idle(self, sandbox: WarmSandbox) -> None:
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

    def __enter__(self) -> "WarmKeeper":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
