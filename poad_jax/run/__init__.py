"""Running a training job: the configuration (`config`), one `build` of
everything a run needs from it, the training loop, resume and the run
directory (`train`), checkpoints, metrics, the best-program keeper and the
progress line.  Importing this package imports no JAX (config files import
`poad_jax.run.config`)."""
