"""Side-by-side benchmarks: `python -m poad_jax.bench <name> [flags]`."""
