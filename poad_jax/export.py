"""`python -m poad_jax.export`: the command of `poad_jax.tools.export` (`--help` tells its flags)."""

import sys

try:
    from poad_jax.tools.export import main
except KeyboardInterrupt:  # Ctrl-C while JAX and the libraries load: one line, not a traceback
    print("\ninterrupted while starting; nothing was written", file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        sys.exit(130)
