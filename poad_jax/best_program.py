"""`python -m poad_jax.best_program`: the command of `poad_jax.run.best_program` (its docstring tells its flags)."""

import sys

from poad_jax.run.best_program import main

if __name__ == "__main__":
    sys.exit(main())
