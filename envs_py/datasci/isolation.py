"""The operating-system boundary around a candidate program: bubblewrap.

`bwrap_command(...)` returns the argv that runs the runner inside a
bubblewrap (`bwrap`) sandbox.  Every candidate gets fresh PID, network, IPC,
UTS, cgroup and mount namespaces; its root is an empty tmpfs that holds only:
- `/usr` (and the `/bin`, `/lib*` links to it) and `/etc/ld.so.cache`, read-only;
- the interpreter's prefixes (the venv and the Python it was made from), each
  bound read-only at its own path, with fresh world-traversable (0755)
  directories above it: the mode of the host's `/root` (0700) does not apply
  to the mount point, so no world-readable copy of the interpreter is needed;
- the runner script, read-only, at `SANDBOX_RUNNER`;
- a fresh `/proc` of the new PID namespace and a minimal `/dev`;
- its working directory `SANDBOX_WORKDIR`, a size-capped tmpfs that exists
  only in the sandbox's mount namespace (nothing on the host's disk);
- an empty read-only tmpfs over each directory of `HIDDEN_DATA` (scikit-learn's
  bundled tables, which hold the labels of two of our datasets).

A seccomp filter (`keyring_filter`, loaded by bwrap) refuses the kernel keyring
calls: a key of uid 65534 outlives every sandbox, so it would carry one run's
labels to the next.  Each split of a program gets a sandbox of its own, so
nothing else of one run survives into another.

Who the candidate is:
- Trainer is root: bwrap runs privileged (no user namespace) and drops every
  capability but CAP_SETUID/SETGID/SETPCAP; `setpriv` then becomes the
  unprivileged `uid` (65534, nobody) with no groups, an empty capability
  bounding set and no_new_privs before the interpreter starts.  The
  candidate is that uid on the host, so the kernel's ordinary permission
  checks (and RLIMIT_NPROC, which root ignores) apply to it.
- Trainer is not root: bwrap makes a user namespace (`--unshare-user
  --disable-userns`) in which the candidate has no capabilities; on the host
  it is the trainer's own uid, but it sees no process and no file of the
  trainer outside the read-only binds.

The command inside is `timeout -s KILL <wall>`, so the wall clock is also
enforced from inside the sandbox: when it fires (or when bwrap's own first
process, PID 1 of the namespace, ends for any reason) the kernel kills every
process of the namespace, `setsid()` or not.  `--die-with-parent` ends the
sandbox when the trainer thread that started it dies, `kill -9` included.
"""

from __future__ import annotations

import errno
import functools
import json
import math
import os
import pathlib
import platform
import shutil
import struct
import subprocess
from typing import Sequence

SANDBOX_WORKDIR = "/sandbox"
SANDBOX_RUNNER = "/opt/poad/_runner.py"
ALLOW_UNSANDBOXED_ENV = "POAD_ALLOW_UNSANDBOXED"
# Directories bound from the host whenever they exist (system libraries).
SYSTEM_TREES = ("/usr",)
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SYSTEM_FILES = ("/etc/ld.so.cache",)
# Capabilities that bwrap keeps (root only) so that setpriv can drop to `uid`.
SETPRIV_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP")
# Capabilities that the warm sandbox's zygote keeps: new namespaces and mounts
# for each split, then the split's own drop to `uid`.
ZYGOTE_CAPS = ("CAP_SYS_ADMIN", *SETPRIV_CAPS)
# Seconds the inner clock allows beyond the trainer's, so that the trainer's
# own timeout normally fires first and reports a TimeoutError.
INNER_CLOCK_SLACK_S = 2
# Directories below a site-packages directory that the candidate must not see:
# scikit-learn's bundled tables include breast_cancer and wine, two of our
# datasets, labels and all.
HIDDEN_DATA = ("sklearn/datasets/data",)
# add_key, request_key and keyctl by audit architecture (linux/audit.h).  A key
# in the user keyring of uid 65534 outlives every sandbox, so these calls
# would let one run leave labels for the next one.
KEYRING_SYSCALLS = {
    0xC000003E: (248, 249, 250, 0x40000000 | 248, 0x40000000 | 249, 0x40000000 | 250),  # x86_64 (and x32)
    0x40000003: (286, 287, 288),  # i386, reachable from x86_64 through int 0x80
    0xC00000B7: (217, 218, 219),  # aarch64
    0x40000028: (309, 310, 311),  # arm
    0xC00000F3: (217, 218, 219),  # riscv64
}
# keyctl's number for this machine's native system calls, for the probe.
KEYCTL_BY_MACHINE = {"x86_64": 250, "amd64": 250, "aarch64": 219, "arm64": 219, "riscv64": 219, "armv7l": 311,
                     "i686": 288}
# Classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h).
_BPF_LOAD_WORD = 0x20  # BPF_LD | BPF_W | BPF_ABS
_BPF_JUMP_IF_EQUAL = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_BPF_RETURN = 0x06  # BPF_RET | BPF_K
_SECCOMP_ALLOW = 0x7FFF0000
_SECCOMP_ERRNO = 0x00050000
_NR_OFFSET, _ARCH_OFFSET = 0, 4  # in struct seccomp_data


class SandboxUnavailableError(RuntimeError):
    """bubblewrap is missing or the kernel refuses its namespaces (and unsandboxed runs are not allowed)."""


def allow_unsandboxed_from_env() -> bool:
    """True when `$POAD_ALLOW_UNSANDBOXED` is 1/true/yes (the trainer's explicit opt-out)."""
    return os.environ.get(ALLOW_UNSANDBOXED_ENV, "").strip().lower() in ("1", "true", "yes")


def keyctl_number(machine: str | None = None) -> int | None:
    """Returns keyctl's system call number on `machine` (default: this one), or None when unknown."""
    return KEYCTL_BY_MACHINE.get((machine or platform.machine()).lower())


def _bpf(code: int, k: int, jump_true: int = 0, jump_false: int = 0) -> bytes:
    """One classic BPF instruction (struct sock_filter), in this machine's byte order."""
    return struct.pack("=HBBI", code, jump_true, jump_false, k)


def keyring_filter() -> bytes:
    """Returns a seccomp program (for `bwrap --seccomp`) that fails the keyring calls with EPERM.

    It loads the caller's architecture; for each one of `KEYRING_SYSCALLS` a
    block loads the call's number and jumps to the final EPERM on a keyring
    call.  Every other call, and every architecture not listed, is allowed.
    """
    deny = 1 + sum(len(numbers) + 3 for numbers in KEYRING_SYSCALLS.values()) + 1  # the last instruction
    program = [_bpf(_BPF_LOAD_WORD, _ARCH_OFFSET)]
    for arch, numbers in KEYRING_SYSCALLS.items():
        program.append(_bpf(_BPF_JUMP_IF_EQUAL, arch, 0, len(numbers) + 2))  # another arch: the next block
        program.append(_bpf(_BPF_LOAD_WORD, _NR_OFFSET))
        for number in numbers:
            program.append(_bpf(_BPF_JUMP_IF_EQUAL, number, deny - len(program) - 1, 0))
        program.append(_bpf(_BPF_RETURN, _SECCOMP_ALLOW))
    program.append(_bpf(_BPF_RETURN, _SECCOMP_ALLOW))
    program.append(_bpf(_BPF_RETURN, _SECCOMP_ERRNO | errno.EPERM))
    return b"".join(program)


def find_tool(name: str) -> str | None:
    """Returns the absolute path of a system tool (PATH, then /usr/bin and /bin), or None."""
    return shutil.which(name) or shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")


@functools.lru_cache(maxsize=None)
def interpreter_prefixes(python: str) -> tuple[str, ...]:
    """Returns the directories `python` needs at run time, as the interpreter reports them.

    These are its prefixes (the venv and the Python it was made from) and any
    `site-packages`/`dist-packages` directory on its `sys.path` (a `.pth`
    file may point at one elsewhere); other `sys.path` entries, such as the
    repository of an editable install, are left out.  Both the path as given
    and its real path are returned when they differ.  Raises
    SandboxUnavailableError when the interpreter cannot be started.
    """
    script = ("import sys, json; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix, "
              "sys.base_exec_prefix] + [p for p in sys.path if p.rstrip('/').endswith(('site-packages', "
              "'dist-packages'))]))")
    try:
        out = subprocess.run([python, "-I", "-c", script], capture_output=True, text=True, timeout=60, check=True)
        prefixes = json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as error:
        raise SandboxUnavailableError(f"cannot ask {python} for its prefixes: {error}") from error
    paths = []
    for prefix in prefixes:
        for path in (os.path.abspath(prefix), os.path.realpath(prefix)):
            if path not in paths:
                paths.append(path)
    return tuple(paths)


def _is_within(path: str, roots: Sequence[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def read_only_binds(python: str) -> list[str]:
    """Returns the host directories bound read-only at their own paths: system trees and the interpreter."""
    binds = [tree for tree in SYSTEM_TREES if os.path.isdir(tree)]
    for prefix in sorted(interpreter_prefixes(python), key=len):
        if not _is_within(prefix, binds) and os.path.isdir(prefix):
            binds.append(prefix)
    return binds


def hidden_data_dirs(python: str) -> list[str]:
    """Returns the directories of `HIDDEN_DATA` below `python`'s prefixes that exist on the host."""
    found = []
    for prefix in interpreter_prefixes(python):
        for relative in HIDDEN_DATA:
            path = os.path.join(prefix, relative)
            if os.path.isdir(path) and path not in found:
                found.append(path)
    return found


def _parent_directories(paths: Sequence[str]) -> list[str]:
    """Returns every ancestor of `paths` below `/`, outermost first, without duplicates."""
    parents: list[str] = []
    for path in paths:
        for parent in reversed(pathlib.PurePosixPath(path).parents):
            text = str(parent)
            if text != "/" and text not in parents:
                parents.append(text)
    return parents


def bwrap_command(python: str, runner: str, uid: int, wall_seconds: float, workdir_bytes: int,
                  info_fd: int | None = None, is_root: bool | None = None, seccomp_fd: int | None = None,
                  zygote_fd: int | None = None) -> list[str]:
    """Returns the argv that runs `python -I runner SANDBOX_WORKDIR` inside a new sandbox.

    `uid` is the host user of the candidate when the trainer is root; see the
    module docstring for the layout and for the non-root case.  `info_fd`
    (inherited by bwrap) receives bwrap's JSON with the host pid of the
    sandbox's first process, which the trainer kills to end the sandbox.
    `seccomp_fd` (inherited) holds `keyring_filter()`, read by bwrap to its
    end.  Raises SandboxUnavailableError when bwrap, timeout or (root)
    setpriv is missing.

    With `zygote_fd` (an inherited control socket) the command runs
    `python -I runner SANDBOX_WORKDIR --zygote FD UID` instead: the warm
    sandbox, whose zygote makes new namespaces, mounts and a new identity for
    each split itself.  It keeps CAP_SYS_ADMIN for that (and, as root,
    CAP_SETUID/SETGID/SETPCAP, every other capability dropped; no setpriv:
    each split's candidate process drops to `uid` itself); its root is
    read-only, and `wall_seconds` is the clock of the whole sandbox.
    """
    is_root = os.geteuid() == 0 if is_root is None else is_root
    setpriv = is_root and zygote_fd is None
    tools = {name: find_tool(name) for name in ("bwrap", "timeout", *(["setpriv"] if setpriv else []))}
    missing = [name for name, path in tools.items() if path is None]
    if missing:
        hint = " (Debian: apt-get install bubblewrap; or run scripts/setup.sh as root)" if "bwrap" in missing else ""
        raise SandboxUnavailableError(f"{', '.join(missing)} not found{hint}")
    binds = read_only_binds(python)
    argv = [tools["bwrap"], "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session"]
    if info_fd is not None:
        argv += ["--info-fd", str(info_fd)]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    if zygote_fd is not None:
        argv += ["--cap-drop", "ALL"] if is_root else []
        argv += [arg for cap in (ZYGOTE_CAPS if is_root else ZYGOTE_CAPS[:1] + SETPRIV_CAPS[2:])
                 for arg in ("--cap-add", cap)]
    elif is_root:
        argv += [arg for cap in SETPRIV_CAPS for arg in ("--cap-add", cap)]
    if not is_root:
        argv += ["--unshare-user", "--disable-userns"]
    parents = _parent_directories([*binds, *SYSTEM_FILES, SANDBOX_RUNNER])
    for parent in parents:
        if not _is_within(parent, binds):
            argv += ["--perms", "0755", "--dir", parent]
    for tree in binds:
        argv += ["--ro-bind", tree, tree]
    for link in SYSTEM_LINKS:
        if os.path.islink(link):
            argv += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link) and not _is_within(link, binds):
            argv += ["--ro-bind", link, link]
    for path in SYSTEM_FILES:
        if os.path.isfile(path):
            argv += ["--ro-bind", path, path]
    for hidden in hidden_data_dirs(python):
        argv += ["--perms", "0555", "--tmpfs", hidden, "--remount-ro", hidden]
    argv += ["--ro-bind", str(runner), SANDBOX_RUNNER, "--proc", "/proc", "--dev", "/dev",
             "--size", str(int(workdir_bytes)), "--perms", "1777", "--tmpfs", SANDBOX_WORKDIR,
             "--chdir", SANDBOX_WORKDIR]
    if zygote_fd is not None:
        argv += ["--remount-ro", "/"]  # the tmpfs root: a split could otherwise leave files there for the next
    argv += ["--"]
    inner_seconds = int(math.ceil(wall_seconds)) + INNER_CLOCK_SLACK_S
    argv += [tools["timeout"], "-s", "KILL", str(inner_seconds)]
    if zygote_fd is not None:
        return argv + [python, "-I", SANDBOX_RUNNER, SANDBOX_WORKDIR, "--zygote", str(zygote_fd), str(int(uid))]
    if is_root:
        argv += [tools["setpriv"], f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                 "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]
    argv += [python, "-I", SANDBOX_RUNNER, SANDBOX_WORKDIR]
    return argv
