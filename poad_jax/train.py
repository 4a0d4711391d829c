"""`python -m poad_jax.train`: the command of `poad_jax.run.cli` (`--help` tells its flags)."""

import os
import signal
import sys

INTERRUPTED_BEFORE_START = "interrupted before the run started; nothing was written"


def _leave_before_start(signum, frame):
    # A handler that leaves at once, not Python's KeyboardInterrupt: while JAX and the libraries
    # load, a KeyboardInterrupt raised inside a garbage-collection callback (JAX registers one) is
    # printed as "Exception ignored" and lost, and the run would go on.  Nothing is written yet.
    del signum, frame
    print(f"\n{INTERRUPTED_BEFORE_START}", file=sys.stderr, flush=True)
    os._exit(130)


_ours = signal.getsignal(signal.SIGINT) is signal.default_int_handler  # not when SIGINT is ignored
if _ours:
    signal.signal(signal.SIGINT, _leave_before_start)
try:
    from poad_jax.run.cli import cli
except KeyboardInterrupt:
    _leave_before_start(None, None)

if __name__ == "__main__":
    cli(restore_interrupt=_ours)
