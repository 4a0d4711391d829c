"""How each `python -m poad_jax.<command>` starts and ends (the shims `poad_jax/train.py`, `evaluate.py`,
`export.py`, `study.py`, `best_program.py`): a Ctrl-C while JAX and the libraries load, or while the command
runs, ends it with one line on stderr and exit status 130, never a traceback.  Importing this module imports
no JAX."""

from __future__ import annotations

import _thread
import importlib
import os
import signal
import sys
import threading
from typing import NoReturn

EXIT_INTERRUPTED = 130
INTERRUPTED_WHILE_STARTING = "interrupted while starting; nothing was written"
REDELIVERY_DELAY_S = 0.05  # see `redeliver_lost_ctrl_c`


def leave_while_starting(signum=None, frame=None) -> NoReturn:
    """Print one line and leave at once: nothing is written before a command has loaded."""
    del signum, frame
    print(f"\n{INTERRUPTED_WHILE_STARTING}", file=sys.stderr, flush=True)
    os._exit(EXIT_INTERRUPTED)


def leave_at_once_on_ctrl_c() -> bool:
    """While the libraries load, a Ctrl-C leaves at once rather than raising KeyboardInterrupt: raised inside
    a garbage-collection callback (JAX registers one) it is printed as "Exception ignored" and lost, and the
    command would go on.  Returns whether the handler was installed (not where SIGINT is ignored, as under a
    background runner); the caller gives SIGINT Python's handler back once loaded (`restore_ctrl_c`)."""
    ours = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if ours:
        signal.signal(signal.SIGINT, leave_while_starting)
    return ours


def restore_ctrl_c(installed: bool) -> None:
    """SIGINT raises KeyboardInterrupt again, where `leave_at_once_on_ctrl_c` had replaced it, and a
    KeyboardInterrupt lost where Python cannot raise (`redeliver_lost_ctrl_c`) is delivered again."""
    if installed:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if not getattr(sys.unraisablehook, "redelivers_ctrl_c", False):
            sys.unraisablehook = redeliver_lost_ctrl_c(sys.unraisablehook)


def redeliver_lost_ctrl_c(previous, delay_s: float = REDELIVERY_DELAY_S):
    """An unraisable-exception hook for `sys.unraisablehook`.  Python runs the SIGINT handler at the next
    bytecode of the main thread; when that bytecode is inside a garbage-collection callback (JAX's
    `_xla_gc_callback`), a `__del__` or a weakref callback, the KeyboardInterrupt it raises cannot propagate:
    Python hands it to this hook and goes on, and a Ctrl-C during JAX's first compilations was lost (the run
    went on to its end, status 0).  The hook simulates the Ctrl-C again `delay_s` later from another thread
    (`_thread.interrupt_main`): by then the main thread has left the callback, and should it be inside one
    again, the hook runs again.  (Simulated at once, the Ctrl-C would land in the hook's own bytecode and be
    lost for good.)  Any other report goes to `previous`."""
    def hook(unraisable):
        if unraisable.exc_type is not KeyboardInterrupt:
            previous(unraisable)
            return
        timer = threading.Timer(delay_s, _thread.interrupt_main, args=(signal.SIGINT,))
        timer.daemon = True
        try:
            timer.start()
        except RuntimeError:  # no new threads while the interpreter shuts down: report it as Python would
            previous(unraisable)

    hook.redelivers_ctrl_c = True
    return hook


def run_command(module: str) -> NoReturn:
    """Load `module` (e.g. "poad_jax.tools.evaluate") and exit with the status its `main()` returns; a Ctrl-C
    while it loads or runs is one line and status 130 (a command that catches it itself says more)."""
    installed = leave_at_once_on_ctrl_c()
    try:
        main = importlib.import_module(module).main
    except KeyboardInterrupt:
        leave_while_starting()
    restore_ctrl_c(installed)
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
