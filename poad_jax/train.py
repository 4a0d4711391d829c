"""`python -m poad_jax.train`: the command of `poad_jax.run.train` (its docstring tells its flags)."""

from poad_jax.run.train import cli

if __name__ == "__main__":
    cli()
