"""`python -m poad_jax.evaluate`: the command of `poad_jax.tools.evaluate` (its docstring tells its flags)."""

import sys

from poad_jax.tools.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
