"""`python -m poad_jax.best_program`: the command of `poad_jax.run.best_program` (`--help` tells its flags)."""

import sys

try:
    from poad_jax.run.best_program import main
except KeyboardInterrupt:  # Ctrl-C while JAX and the libraries load: one line, not a traceback
    print("\ninterrupted while starting; nothing was written", file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        sys.exit(130)
