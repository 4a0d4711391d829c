#!/usr/bin/env bash
# VirtualHome at the authors' own settings (studies/virtualhome_paper.py, docs/results.md):
# first every cell to 1,024 env steps (does the paper's lr move anything?), then every cell
# to 6,000.  Hours on 2 cores; resumable: re-run the same command after any interruption.
#   nohup bash scripts/run_virtualhome_paper.sh >> runs/studies/paper.log 2>&1 &
set -uo pipefail
cd "$(dirname "$0")/.."
nice -n 5 .venv/bin/python -m poad_jax.study --study=studies/virtualhome_paper.py --up-to=1024 || exit $?
nice -n 5 .venv/bin/python -m poad_jax.study --study=studies/virtualhome_paper.py || exit $?
.venv/bin/python -m poad_jax.study --study=studies/virtualhome_paper.py --report --publish=docs/results
