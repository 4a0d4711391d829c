#!/usr/bin/env bash
# The paper-task studies of docs/results.md, one cell at a time: VirtualHome
# food preparation with SmolLM2-135M (the learning-rate sweep, then POAD vs
# NTPO vs TWOSOME over three seeds, 7-8 hours on 2 cores), then DataSciCoding
# with Qwen2.5-Coder-0.5B (POAD vs NTPO, about 1.5 hours), then POAD sampling as
# the paper's code does on VirtualHome (3 new cells, about 2 hours); then the reports.
# Resumable: re-run the same command after any interruption (finished cells
# are skipped, a cell in progress resumes from its last checkpoint).
#   nohup bash scripts/run_paper_studies.sh > runs/studies/paper.log 2>&1 &
set -uo pipefail
cd "$(dirname "$0")/.."
for study in virtualhome_lr virtualhome datasci_qwen virtualhome_sampling; do
  .venv/bin/python -m poad_jax.study --study="studies/$study.py" || exit $?
done
for study in virtualhome virtualhome_sampling datasci_qwen; do
  .venv/bin/python -m poad_jax.study --study="studies/$study.py" --report --publish=docs/results
done
