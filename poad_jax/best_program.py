"""`python -m poad_jax.best_program`: the command of `poad_jax.run.best_program` (`--help` tells its flags)."""

if __name__ == "__main__":
    from poad_jax.run.entry import run_command

    run_command("poad_jax.run.best_program")
