"""`python -m poad_jax.export`: the command of `poad_jax.tools.export` (its docstring tells its flags)."""

import sys

from poad_jax.tools.export import main

if __name__ == "__main__":
    sys.exit(main())
