"""Sandbox runner: executed as `python -I _runner.py WORKDIR` in a fresh process, once per split.

Never imported by the trainer.  It reads one split's job from stdin (a line
of JSON with the limits and the candidate's code, then an `.npz` with that
split's training rows and labels, its test rows' features and the class
list), applies the limits, installs an audit hook that confines the
candidate, runs the candidate's `build_model` once and writes one `.npz` (a
JSON status and the test rows' probabilities) to its original stdout.  The
process holds nothing of any other split, so walking the stack or the heap
finds only what `build_model` was given.  Everything the candidate prints,
through Python or through descriptors 1 and 2, goes to stderr, which the
trainer reads with a cap.  The parent computes the scores; this process
never sees a test label.  Inside bubblewrap WORKDIR is a private tmpfs; in
the explicitly allowed unsandboxed mode it is a temporary directory.
"""

import io
import json
import os
import resource
import sys
import threading
import traceback

WORKDIR = os.path.realpath(sys.argv[1])
ERROR_CHARS = 4000

# The job comes on stdin; the result leaves on a private duplicate of the
# original stdout, and descriptor 1 becomes stderr so that the candidate's
# raw writes cannot be mistaken for the result stream by accident.
PAYLOAD = sys.stdin.buffer.read()
_header, _, ARRAYS = PAYLOAD.partition(b"\n")
JOB = json.loads(_header)
del PAYLOAD, _header
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)
RESULT_FD = os.dup(1)
os.dup2(2, 1)


def write_result(status, arrays):
    """Writes the status and arrays as one .npz to the result stream."""
    import numpy as np

    buffer = io.BytesIO()
    status_bytes = np.frombuffer(json.dumps(status).encode("utf-8"), dtype=np.uint8)
    np.savez(buffer, status=status_bytes, **arrays)
    view = memoryview(buffer.getvalue())
    while view:
        view = view[os.write(RESULT_FD, view):]


def apply_limits(job):
    limits = [
        (resource.RLIMIT_CPU, job["cpu_seconds"]),
        (resource.RLIMIT_AS, job["memory_bytes"]),
        (resource.RLIMIT_FSIZE, job["file_bytes"]),
        (resource.RLIMIT_NPROC, job["max_processes"]),
        (resource.RLIMIT_CORE, 0),
    ]
    for kind, value in limits:
        soft, hard = resource.getrlimit(kind)
        value = int(value)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(kind, (value, value))


def isolate_network():
    """Moves this process into an empty network namespace; returns True on success."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        clone_newuser, clone_newnet = 0x10000000, 0x40000000
        for flags in (clone_newnet, clone_newuser | clone_newnet):
            if libc.unshare(flags) == 0:
                return True
    except Exception:
        pass
    return False


def only_loopback_visible():
    """True when /proc lists no network interface but `lo` (an empty network namespace)."""
    try:
        with open("/proc/self/net/dev") as handle:
            names = {line.split(":", 1)[0].strip() for line in handle.readlines()[2:]}
    except OSError:
        return False
    return names <= {"lo"}


apply_limits(JOB)
NETWORK_ISOLATED = (isolate_network() if JOB["isolate_network"] else False) or only_loopback_visible()

# numpy loads the data before the audit hook; scikit-learn is imported by
# the candidate itself (after the hook), so programs that fail early stay cheap.
import numpy as np  # noqa: E402

DATA = dict(np.load(io.BytesIO(ARRAYS), allow_pickle=False))
CANDIDATE = JOB["code"]
del ARRAYS


# ---------------------------------------------------------------------------
# Audit hook: confines Python-level file writes, processes, signals, sockets.

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_BLOCKED_EVENTS = {
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
    "os.kill", "os.killpg", "signal.pthread_kill", "subprocess.Popen", "pty.spawn",
    "os.setuid", "os.setgid", "os.setsid",
}
_PATH_EVENTS = {  # event -> indices of path arguments that get written
    "os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1),
    "os.chmod": (0,), "os.chown": (0,), "os.symlink": (1,), "os.link": (1,),
    "os.truncate": (0,), "os.utime": (0,), "shutil.rmtree": (0,), "shutil.copyfile": (1,),
    "shutil.copytree": (1,), "shutil.move": (0, 1), "os.chdir": (0,), "os.chroot": (0,),
}
_guard = threading.local()


def _inside_workdir(path):
    if isinstance(path, int):
        return True  # an already-open descriptor
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    full = os.path.realpath(os.path.join(WORKDIR, os.fspath(path)))
    return full == WORKDIR or full.startswith(WORKDIR + os.sep)


def _private_proc_path(path):
    """True for /proc/<pid>/... of another process (environ, memory, ...)."""
    if isinstance(path, int):
        return False
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    parts = os.path.realpath(os.fspath(path)).split(os.sep)
    return len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and parts[2] != str(os.getpid())


def audit(event, args):
    if getattr(_guard, "busy", False):
        return
    _guard.busy = True
    try:
        if event in _BLOCKED_EVENTS or event.startswith("socket."):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "open":
            path, mode, flags = args
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS
            )
            if writes and not _inside_workdir(path):
                raise PermissionError(f"sandbox: writing {path!r} outside the working directory")
            if _private_proc_path(path):
                raise PermissionError(f"sandbox: reading {path!r} is not allowed")
        elif event in _PATH_EVENTS:
            for index in _PATH_EVENTS[event]:
                if index < len(args) and args[index] is not None and not _inside_workdir(args[index]):
                    raise PermissionError(f"sandbox: {event} outside the working directory")
    finally:
        _guard.busy = False


class CappedStream:
    """A text sink that raises once more than `limit` characters were written."""

    def __init__(self, limit):
        self.limit, self.count = limit, 0

    def write(self, text):
        self.count += len(text)
        if self.count > self.limit:
            raise OverflowError(f"output limit of {self.limit} characters exceeded")
        return len(text)

    def flush(self):
        pass


def class_probabilities(model, x_test, classes):
    """Returns [n_test, len(classes)] probabilities aligned to `classes`."""
    if not hasattr(model, "predict_proba"):
        raise TypeError(
            f"build_model returned {type(model).__name__}, not a fitted classifier with predict_proba"
        )
    proba = np.asarray(model.predict_proba(x_test), dtype=np.float64)
    model_classes = list(getattr(model, "classes_", classes))
    if proba.ndim != 2 or proba.shape != (len(x_test), len(model_classes)):
        raise ValueError(f"predict_proba returned shape {proba.shape}, expected ({len(x_test)}, {len(model_classes)})")
    aligned = np.zeros((len(x_test), len(classes)))
    for column, label in enumerate(model_classes):
        if label not in classes:
            raise ValueError(f"model predicts unknown class {label!r}")
        aligned[:, classes.index(label)] = proba[:, column]
    return aligned


def main():
    """Runs the candidate on this process's split and writes the result; exits without teardown."""
    classes = [int(c) for c in DATA["classes"]]
    namespace = {"__name__": "candidate", "__builtins__": __builtins__}
    sys.addaudithook(audit)
    sys.stdout = sys.stderr = CappedStream(JOB["max_output_chars"])
    results = {}
    try:
        exec(compile(CANDIDATE, "<candidate>", "exec"), namespace)
        build_model = namespace.get("build_model")
        if not callable(build_model):
            raise NameError("the code does not define a function build_model(x_train, y_train)")
        model = build_model(DATA["x_train"].copy(), DATA["y_train"].copy())
        results["proba"] = class_probabilities(model, DATA["x_test"].copy(), classes)
        status = {"ok": True}
    except BaseException as error:  # SystemExit and KeyboardInterrupt included
        sys.stdout = sys.stderr = sys.__stderr__
        lines = traceback.format_exception(type(error), error, error.__traceback__)
        kept = [line for line in lines if "_runner.py" not in line]
        message = f"{type(error).__name__}: {error}"
        status = {"ok": False, "error": message[:ERROR_CHARS], "traceback": "".join(kept)[-ERROR_CHARS:]}
        results = {}
    status["network_isolated"] = NETWORK_ISOLATED
    write_result(status, results)
    os._exit(0)  # skip interpreter teardown: candidate objects may misbehave in __del__


main()
