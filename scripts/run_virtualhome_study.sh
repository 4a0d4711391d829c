#!/usr/bin/env bash
# VirtualHome food preparation with SmolLM2-135M (docs/results.md): the
# learning-rate sweep, then POAD vs NTPO vs TWOSOME over three seeds.
# Resumable: re-run the same command after any interruption (finished cells
# are skipped, a cell in progress resumes from its last checkpoint).
# About 7-8 hours on 2 cores; one cell at a time.
#   nohup bash scripts/run_virtualhome_study.sh > runs/studies/virtualhome.log 2>&1 &
set -uo pipefail
cd "$(dirname "$0")/.."
for study in virtualhome_lr virtualhome; do
  .venv/bin/python -m poad_jax.study --study="studies/$study.py" || exit $?
done
.venv/bin/python -m poad_jax.study --study=studies/virtualhome.py --report --publish=docs/results
