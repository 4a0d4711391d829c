#!/usr/bin/env bash
# VirtualHome at the authors' own settings (docs/results.md).  Hours on 2 cores; resumable:
# re-run the same command after any interruption.
#   nohup bash scripts/run_virtualhome_paper.sh >> runs/studies/paper.log 2>&1 &
# 1. The actor-lr sweep for the second group (studies/virtualhome_paper_lr.py: its rule is in its
#    docstring), since at the paper's lr nothing moved in the first 1,024 env steps.
# 2. The paper's lr (studies/virtualhome_paper.py): every cell to 1,024 env steps first, then to 6,000.
# The second group's study is written once the sweep has chosen its rate.
set -uo pipefail
cd "$(dirname "$0")/.."
sweep=studies/virtualhome_paper_lr.py
nice -n 5 .venv/bin/python -m poad_jax.study --study=$sweep --up-to=1536 || exit $?
.venv/bin/python scripts/paper_lr_rule.py --env-steps=1536
if [ $? -eq 3 ]; then  # no success anywhere yet: the rule's extension to 3,072 env steps
  nice -n 5 .venv/bin/python -m poad_jax.study --study=$sweep || exit $?
  .venv/bin/python scripts/paper_lr_rule.py --env-steps=3072
fi
.venv/bin/python -m poad_jax.study --study=$sweep --report --publish=docs/results
nice -n 5 .venv/bin/python -m poad_jax.study --study=studies/virtualhome_paper.py --up-to=1024 || exit $?
nice -n 5 .venv/bin/python -m poad_jax.study --study=studies/virtualhome_paper.py || exit $?
.venv/bin/python -m poad_jax.study --study=studies/virtualhome_paper.py --report --publish=docs/results
