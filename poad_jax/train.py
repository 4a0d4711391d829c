"""`python -m poad_jax.train`: the command of `poad_jax.run.cli` (`--help` tells its flags)."""

if __name__ == "__main__":
    from poad_jax.run import entry

    installed = entry.leave_at_once_on_ctrl_c()  # Ctrl-C while JAX and the libraries load: one line, at once
    try:
        from poad_jax.run.cli import cli
    except KeyboardInterrupt:
        entry.leave_while_starting()
    cli(restore_interrupt=installed)
