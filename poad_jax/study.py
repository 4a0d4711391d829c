"""`python -m poad_jax.study`: the command of `poad_jax.tools.study.cli` (its docstring tells its flags)."""

import sys

from poad_jax.tools.study.cli import main

if __name__ == "__main__":
    sys.exit(main())
