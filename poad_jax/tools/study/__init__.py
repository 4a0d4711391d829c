"""Studies: grids of training runs with seed bands (`python -m poad_jax.study`).

`spec` (the study file and its grid), `scheduler` (running the cells as
subprocesses, resuming and reusing them), `report` (aggregation, plots,
provenance), `cli` (the command; its docstring describes a study file).
"""
