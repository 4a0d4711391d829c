"""`python -m poad_jax.study`: the command of `poad_jax.tools.study.cli` (`--help` tells its flags)."""

if __name__ == "__main__":
    from poad_jax.run.entry import run_command

    run_command("poad_jax.tools.study.cli")
