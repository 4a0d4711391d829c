"""`python -m poad_jax.train`: the command of `poad_jax.run.cli` (its docstring tells its flags)."""

from poad_jax.run.cli import cli

if __name__ == "__main__":
    cli()
