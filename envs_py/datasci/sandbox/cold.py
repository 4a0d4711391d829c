"""The cold path: each split in a new runner of its own, in a new bubblewrap sandbox or, when allowed, none.

Used with `SandboxLimits(warm=False)`, where the warm probe fails but the
cold one holds, and for the explicitly allowed unsandboxed mode.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import tempfile
import time

import numpy as np

from envs_py.datasci import isolation
from envs_py.datasci.sandbox.limits import RUNNER, CandidateResult, SandboxLimits, scrubbed_environment
from envs_py.datasci.sandbox.pipes import Exchange, exchange, filter_pipe, job_payload
from envs_py.datasci.sandbox.reaping import end_sandbox, kill_group
from envs_py.datasci.sandbox.scoring import result_cap_bytes, split_outcome


def run_child(argv: list[str], payload: bytes, cwd: str, env: dict, deadline: float, result_cap: int, log_cap: int,
              sandboxed: bool, info_pipe: tuple[int, int] | None = None,
              pass_fds: tuple[int, ...] = ()) -> tuple[int, Exchange]:
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
    got = Exchange()
    try:
        got = exchange(process, payload, deadline, result_cap, log_cap, info_r)
        if not (got.timed_out or got.overflow):
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                got.timed_out = True
    finally:
        if sandboxed:
            end_sandbox(process, got.info)
        else:
            kill_group(process.pid)
            process.wait()
        for stream in (process.stdin, process.stdout, process.stderr):
            stream.close()
        if info_r is not None:
            os.close(info_r)
    return process.returncode, got


def run_sandboxed(payload: bytes, limits: SandboxLimits, deadline: float, result_cap: int, log_cap: int,
                  python: str) -> tuple[int, Exchange]:
    """Runs one split's job in a new bubblewrap sandbox, with the keyring filter, and ends it."""
    info_pipe = os.pipe()
    opened = list(info_pipe)
    try:
        seccomp_r = filter_pipe()
        opened.append(seccomp_r)
        # The inner clock is the same for every split: it tells a split nothing.
        argv = isolation.bwrap_command(python, str(RUNNER), limits.run_as_uid, limits.wall_seconds,
                                       limits.workdir_bytes, info_fd=info_pipe[1], seccomp_fd=seccomp_r)
    except BaseException:
        for fd in opened:
            os.close(fd)
        raise
    env = scrubbed_environment(isolation.SANDBOX_WORKDIR)
    return run_child(argv, payload, "/", env, deadline, result_cap, log_cap, True, info_pipe, (seccomp_r,))


def run_unsandboxed(payload: bytes, deadline: float, result_cap: int, log_cap: int, base_dir,
                    python: str) -> tuple[int, Exchange]:
    """Runs one split's job as a plain child process in a new temporary directory, removed afterwards."""
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="poad_sandbox_", dir=base_dir))
    try:
        argv = [python, "-I", str(RUNNER), str(workdir)]
        return run_child(argv, payload, str(workdir), scrubbed_environment(workdir), deadline, result_cap,
                         log_cap, False)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def evaluate_cold(code, X, y, limits, splits, base_dir, python, sandboxed: bool) -> CandidateResult:
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
        cap = result_cap_bytes(len(test), len(classes))
        log_cap = limits.max_output_chars - printed  # the output limit is the candidate's, over all splits
        deadline = time.monotonic() + limits.wall_seconds
        if sandboxed:
            returncode, got = run_sandboxed(payload, limits, deadline, cap, log_cap, python)
        else:
            returncode, got = run_unsandboxed(payload, deadline, cap, log_cap, base_dir, python)
        printed += got.log_bytes
        outcome = split_outcome(got, returncode, y[test], classes, index, limits, sandboxed)
        isolated = isolated and outcome.network_isolated
        if outcome.error:
            return CandidateResult(False, error=outcome.error, seconds=time.monotonic() - start,
                                   network_isolated=isolated, sandboxed=sandboxed, splits_run=index + 1,
                                   failure_stage=outcome.stage)
        aucs.append(outcome.auc)
    return CandidateResult(True, tuple(aucs), seconds=time.monotonic() - start, network_isolated=isolated,
                           sandboxed=sandboxed, splits_run=len(splits))
