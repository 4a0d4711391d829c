"""Studies: grids of training runs with seed bands (`python -m poad_jax.study`).

`spec` (the study file and its grid), `scheduler` (running the cells as
subprocesses, resuming and reusing them), `report` (the report, written and
published as a page, `page`) from its numbers (`statistics`), tables
(`tables`), provenance line (`provenance`), figures (`figures`) and sections
(`actions`: what the policies wrote; `programs`: DataSciCoding's best
programs; `speed`: how soon cells learn; `evaluations`: the cells played at
their final checkpoints), `cli` (the command; its docstring describes a
study file).
"""
