"""`python -m poad_jax.train`: the command of `poad_jax.run.cli` (`--help` tells its flags)."""

import sys

try:
    from poad_jax.run.cli import cli
except KeyboardInterrupt:  # Ctrl-C while JAX and the libraries load: one line, not a traceback
    print("\ninterrupted before the run started; nothing was written", file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":
    cli()
