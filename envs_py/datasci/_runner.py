"""Sandbox runner: `python -I _runner.py WORKDIR` runs one split; `... WORKDIR --zygote FD UID` many.

Never imported by the trainer.  Cold (`SandboxLimits(warm=False)`): a fresh
process per split reads that split's job from stdin (a line of JSON with the
limits and the candidate's code, then an `.npz` with that split's training
rows and labels, its test rows' features and the class list), applies the
limits, installs an audit hook that confines the candidate, runs the
candidate's `build_model` once and writes one `.npz` (a JSON status and the
test rows' probabilities) to its original stdout.

Warm (the default): this file is the zygote of one sandbox.  It imports
numpy, then scikit-learn's common modules between requests (once), and
serves split requests that arrive on the control socket FD, each carrying four descriptors (the job's pipe, the
result's pipe, the log's pipe and a status socket).  It never reads a job
and never runs candidate code: for each request it forks a watcher, which
makes a new PID namespace and forks that namespace's first process; that
one makes new mount, IPC, network and UTS namespaces, mounts a fresh
`/proc`, a fresh size-capped tmpfs over WORKDIR and makes `/dev` read-only,
then forks the candidate's process.  That process drops to UID (root
trainer) or to no capabilities at all (user namespace), with an empty
bounding set and no_new_privs, reads its own split's job from its own pipe
and runs exactly as a cold runner does from there.  When it ends, the first
process exits and the kernel kills whatever it left in the namespace; the
watcher reports the exit status on the status socket, and kills the
namespace when its clock runs out or the trainer asks.

Either way the candidate's process holds nothing of any other split, so
walking the stack or the heap finds only what `build_model` was given.
Everything the candidate prints, through Python or through descriptors 1 and
2, goes to the log pipe, which the trainer reads with a cap.  The parent
computes the scores; this process never sees a test label.
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
READ_CHUNK = 1 << 16
RESULT_FD = -1
JOB, DATA, CANDIDATE, NETWORK_ISOLATED = {}, {}, "", False
STAGE = "extract"  # how far the candidate got (main)


def read_all(fd):
    """Returns every byte of `fd` up to its end of file."""
    chunks = []
    while True:
        chunk = os.read(fd, READ_CHUNK)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


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


def take_job(fd):
    """Reads the job from `fd` to its end, applies its limits and loads it into JOB, DATA and CANDIDATE."""
    global JOB, DATA, CANDIDATE, NETWORK_ISOLATED, np
    header, _, arrays = read_all(fd).partition(b"\n")
    JOB = json.loads(header)
    del header
    apply_limits(JOB)
    NETWORK_ISOLATED = (isolate_network() if JOB["isolate_network"] else False) or only_loopback_visible()
    # numpy loads the data before the audit hook; scikit-learn is imported by
    # the candidate itself (after the hook; the warm zygote has it already).
    import numpy as np

    DATA = dict(np.load(io.BytesIO(arrays), allow_pickle=False))
    CANDIDATE = JOB["code"]


def cold_start():
    """One split in this fresh process: the job on stdin, the result on a private duplicate of stdout.

    Descriptor 1 becomes stderr so that the candidate's raw writes cannot be
    mistaken for the result stream by accident.
    """
    global RESULT_FD
    RESULT_FD = os.dup(1)
    os.dup2(2, 1)
    take_job(0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    main()


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
    """Returns [n_test, len(classes)] probabilities aligned to `classes`; moves STAGE on to "proba"
    once predict_proba has returned."""
    global STAGE
    if not hasattr(model, "predict_proba"):
        raise TypeError(
            f"build_model returned {type(model).__name__}, not a fitted classifier with predict_proba"
        )
    raw = model.predict_proba(x_test)
    STAGE = "proba"
    proba = np.asarray(raw, dtype=np.float64)
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
    """Runs the candidate on this process's split and writes the result; exits without teardown.

    A failure's status names the stage it happened in (envs_py/datasci/stages.py lists them): STAGE
    moves on as the candidate gets further; a MemoryError or the output cap is "limit" wherever it
    happens."""
    global STAGE
    classes = [int(c) for c in DATA["classes"]]
    namespace = {"__name__": "candidate", "__builtins__": __builtins__}
    sys.addaudithook(audit)
    capped = CappedStream(JOB["max_output_chars"])
    sys.stdout = sys.stderr = capped
    results = {}
    try:
        STAGE = "extract"
        code = compile(CANDIDATE, "<candidate>", "exec")
        STAGE = "import"
        exec(code, namespace)
        build_model = namespace.get("build_model")
        if not callable(build_model):
            STAGE = "extract"
            raise NameError("the code does not define a function build_model(x_train, y_train)")
        STAGE = "build"
        model = build_model(DATA["x_train"].copy(), DATA["y_train"].copy())
        STAGE = "build" if model is None else "predict_proba"
        results["proba"] = class_probabilities(model, DATA["x_test"].copy(), classes)
        status = {"ok": True}
    except BaseException as error:  # SystemExit and KeyboardInterrupt included
        sys.stdout = sys.stderr = sys.__stderr__
        lines = traceback.format_exception(type(error), error, error.__traceback__)
        kept = [line for line in lines if "_runner.py" not in line]
        message = f"{type(error).__name__}: {error}"
        limit = isinstance(error, MemoryError) or (isinstance(error, OverflowError) and capped.count > capped.limit)
        status = {"ok": False, "error": message[:ERROR_CHARS], "traceback": "".join(kept)[-ERROR_CHARS:],
                  "stage": "limit" if limit else STAGE}
        results = {}
    status["network_isolated"] = NETWORK_ISOLATED
    write_result(status, results)
    os._exit(0)  # skip interpreter teardown: candidate objects may misbehave in __del__




# ---------------------------------------------------------------------------
# The warm zygote: imports once, forks a fresh, isolated process per split.

PRELOADED = ("sklearn", "sklearn.linear_model", "sklearn.ensemble", "sklearn.tree", "sklearn.neighbors",
             "sklearn.naive_bayes", "sklearn.svm", "sklearn.preprocessing", "sklearn.pipeline",
             "sklearn.model_selection", "sklearn.metrics", "sklearn.impute", "sklearn.discriminant_analysis",
             "sklearn.neural_network", "sklearn.feature_selection", "sklearn.decomposition", "sklearn.compose")
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 4, 24, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
CAPABILITY_VERSION_3 = 0x20080522
# What bwrap's --proc makes read-only inside a fresh /proc.
PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus")
SPLIT_SETUP_FAILED = 125  # exit status of a split whose namespaces or identity could not be set up
_libc = None


def _say(fd, text):
    """Writes `text` (its tail) to `fd`, ignoring every error: a forked process must reach its own exit."""
    try:
        os.write(fd, text.encode("utf-8", "replace")[-ERROR_CHARS:])
    except BaseException:
        pass


def _checked(result, what):
    if result != 0:
        import ctypes

        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")


def _mount(source, target, fstype, flags, data=None):
    _checked(_libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(), flags,
                         data and data.encode()), f"mount {target}")


def _fresh_namespaces(workdir_bytes):
    """In this split's first process: new mount, IPC, network and UTS namespaces, a fresh /proc and workdir."""
    _checked(_libc.unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWNET | CLONE_NEWUTS), "unshare")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)  # this PID namespace's processes only
    for name in PROC_READ_ONLY:
        path = "/proc/" + name
        if os.path.exists(path):
            _mount(path, path, None, MS_BIND | MS_REC)
            _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _mount("tmpfs", WORKDIR, "tmpfs", MS_NOSUID | MS_NODEV, f"size={int(workdir_bytes)},mode=1777")
    _mount(None, "/dev", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _capability_sets():
    """Returns the CapInh, CapPrm, CapEff, CapBnd and CapAmb lines of this process as integers."""
    sets = {}
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("Cap"):
                name, value = line.split(":", 1)
                sets[name] = int(value, 16)
    return sets


def _drop_privileges(uid, last_cap):
    """Becomes `uid` (when root) with no capability in any set, nothing to gain (no_new_privs); checks it."""
    import ctypes

    for cap in range(last_cap + 1):
        _checked(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"dropping capability {cap} from the bounding set")
    _checked(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clearing ambient capabilities")
    if os.getuid() == 0:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    header = (ctypes.c_uint32 * 2)(CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # two of {effective, permitted, inheritable}, all empty
    _checked(_libc.capset(header, data), "capset")
    _checked(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    # Changing uid made the process undumpable (its /proc files root's); a
    # freshly executed interpreter is dumpable, and the candidate sees the same.
    _checked(_libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "dumpable")
    left = {name: value for name, value in _capability_sets().items() if value}
    if left or os.getuid() == 0 or os.geteuid() == 0:
        raise PermissionError(f"privileges left after dropping them: uid {os.getuid()}, {left}")


def _candidate_process(request, job_r, result_w, log_w, last_cap):
    """The split's candidate: its own descriptors only, no privileges, then the same steps as a cold runner."""
    global RESULT_FD
    import signal

    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a new interpreter (the first process ignores it)
    os.dup2(log_w, 1)
    os.dup2(log_w, 2)
    RESULT_FD = result_w
    keep = sorted({0, 1, 2, job_r, result_w})
    for low, high in zip([-1] + keep, keep + [os.sysconf("SC_OPEN_MAX")]):
        if low + 1 < high:  # closerange(n, n) would close every descriptor from n up
            os.closerange(low + 1, high)
    os.chdir(WORKDIR)  # the fresh tmpfs, not the zygote's directory below it
    _drop_privileges(int(request["uid"]), last_cap)
    import numpy as np

    np.random.seed()  # numpy's global generator from fresh entropy, as in a new interpreter (`random` reseeds at fork)
    take_job(job_r)
    os.close(job_r)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    main()


def _split_init(request, job_r, result_w, log_w, last_cap):
    """PID 1 of the split's namespace: sets the split up, runs its candidate, exits with its status.

    When this process exits, the kernel kills every process left in the
    namespace, and so the split's whole tree.
    """
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _fresh_namespaces(request["workdir_bytes"])
        child = os.fork()
    except BaseException:
        _say(log_w, "sandbox: setting the split up failed\n" + traceback.format_exc())
        os._exit(SPLIT_SETUP_FAILED)
    if child == 0:
        try:
            _candidate_process(request, job_r, result_w, log_w, last_cap)
        except BaseException:
            _say(2, "sandbox: starting the split failed\n" + traceback.format_exc())
        finally:
            os._exit(SPLIT_SETUP_FAILED)
    for fd in (job_r, result_w, log_w):
        os.close(fd)
    while True:
        try:
            pid, status = os.wait()  # reaps the orphans the candidate leaves, too
        except InterruptedError:
            continue
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            os._exit(128 - code if code < 0 else code)  # a signal as 128 + its number, as bwrap reports it


def _watch_split(request, fds, last_cap):
    """Forked per request: a new PID namespace for the split, its clock, and its exit status for the trainer."""
    import select
    import signal
    import socket

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    job_r, result_w, log_w, status_fd = fds
    status = socket.socket(fileno=status_fd)
    report = {"returncode": SPLIT_SETUP_FAILED, "timed_out": False, "killed": False}
    try:
        _checked(_libc.unshare(CLONE_NEWPID), "unshare")
        child = os.fork()
        if child == 0:
            try:
                status.close()
                _split_init(request, job_r, result_w, log_w, last_cap)
            finally:
                os._exit(SPLIT_SETUP_FAILED)
        for fd in (job_r, result_w, log_w):
            os.close(fd)
        handle = os.pidfd_open(child)
        poller = select.poll()
        poller.register(handle, select.POLLIN)
        poller.register(status_fd, select.POLLIN)
        events = dict(poller.poll(float(request["inner_seconds"]) * 1000.0))
        if handle not in events:  # the inner clock ran out, or the trainer asked (or went away)
            report["timed_out"], report["killed"] = not events, True
            os.kill(child, signal.SIGKILL)
        code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
        report["returncode"] = 128 - code if code < 0 else code
    except BaseException as error:
        report["error"] = f"{type(error).__name__}: {error}"[:ERROR_CHARS]
    try:
        status.sendall(json.dumps(report).encode())
    except OSError:
        pass
    os._exit(0)


def zygote(control_fd, uid):
    """Imports numpy and scikit-learn, then forks a watcher per request on `control_fd` until it closes.

    Between requests it imports the other scikit-learn modules of PRELOADED,
    one at a time, and only while no request waits: a split never waits for
    modules it may not need (it imports what it uses itself, as a cold runner
    does), and the splits that come after find them imported.
    """
    global _libc
    import ctypes
    import importlib
    import select
    import signal
    import socket

    _libc = ctypes.CDLL(None, use_errno=True)
    _libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    with open("/proc/sys/kernel/cap_last_cap") as handle:
        last_cap = int(handle.read())
    import numpy

    buffer = io.BytesIO()  # what a split does with its job and result (np.load's zipfile, cp437 among them)
    numpy.savez(buffer, x=numpy.zeros(1))
    dict(numpy.load(io.BytesIO(buffer.getvalue()), allow_pickle=False))
    del buffer
    pending = list(PRELOADED)
    try:
        importlib.import_module(pending.pop(0))  # scikit-learn's core, which every split would import first anyway
    except ImportError:
        pass
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the watchers are reaped by the kernel
    control = socket.socket(fileno=control_fd)
    control.send(b"ready")  # the splits' clocks start from here
    waiting = select.poll()
    waiting.register(control_fd, select.POLLIN)
    while True:
        if pending and not waiting.poll(0):
            try:
                importlib.import_module(pending.pop(0))
            except ImportError:
                pass
            continue
        try:
            message, fds, _, _ = socket.recv_fds(control, 4096, 4)
        except InterruptedError:
            continue
        if not message:
            os._exit(0)  # the trainer closed the control socket: the sandbox ends
        if len(fds) == 4:
            request = {**json.loads(message), "uid": uid}  # the uid of the command line, never the message's
            if os.fork() == 0:
                try:
                    control.close()
                    _watch_split(request, fds, last_cap)
                finally:
                    os._exit(0)
        for fd in fds:
            os.close(fd)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[2] == "--zygote":
        zygote(int(sys.argv[3]), int(sys.argv[4]))
    else:
        cold_start()
