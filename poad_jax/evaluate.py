"""`python -m poad_jax.evaluate`: the command of `poad_jax.tools.evaluate` (`--help` tells its flags)."""

import sys

try:
    from poad_jax.tools.evaluate import main
except KeyboardInterrupt:  # Ctrl-C while JAX and the libraries load: one line, not a traceback
    print("\ninterrupted while starting; nothing was written", file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        sys.exit(130)
