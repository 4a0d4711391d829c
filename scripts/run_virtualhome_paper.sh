#!/usr/bin/env bash
# VirtualHome at the authors' own settings (docs/results.md), the CPU route.  Days on 2 cores; resumable:
# re-run the same command after any interruption, on the same machine (checkpoints live in runs/).
# Both groups were run to the end on a lent H100 on 2026-11-25 instead (scripts/gpu_paper_studies.sh,
# 22 minutes; docs/results.md); this script stays as the way to run them where no GPU is lent.
#   nohup bash scripts/run_virtualhome_paper.sh >> runs/studies/paper.log 2>&1 &
# 1. The actor-lr sweep (studies/virtualhome_paper_lr.py, its rule in its docstring), since at the paper's lr
#    nothing moved in the first 1,024 env steps: first pass to 1,536 env steps; no success -> on to 3,072.
#    The rule takes the largest qualifying rate, so it was settled once the 1e-4 cells reached 3,072
#    (2026-11-25: 1e-4, studies/virtualhome_paper_chosen_lr.py); the lower rates' cells finish last (step 4).
# 2. The second group at the chosen lr, every method, 3 seeds, 6,000 env steps; the sweep's two seed-0 cells
#    at that rate are copied in as its POAD and TWOSOME seed-0 cells' first 3,072 env steps.
# 3. The paper's lr (studies/virtualhome_paper.py): every cell to 1,024 env steps first, then to 6,000.
# 4. The sweep's remaining cells to 3,072 (the sweep's table), and the rule once more on all of them.
set -uo pipefail
cd "$(dirname "$0")/.."
sweep=studies/virtualhome_paper_lr.py
chosen=studies/virtualhome_paper_chosen_lr.py
runs=runs/studies
study() { nice -n 5 .venv/bin/python -m poad_jax.study "$@"; }
study --study=$sweep --up-to=1536 || exit $?
for method in POAD TWOSOME; do  # step 2's copies (once): same config and seed, only total_env_steps differs
  from=$runs/virtualhome_paper_lr/cells/actor_lr=0.0001__${method}__seed=0
  to=$runs/virtualhome_paper_chosen_lr/cells/${method}__seed=0
  if grep -qs '"env_steps": 3072' "$from/finished.json" && [ ! -e "$to" ]; then
    mkdir -p "$(dirname "$to")" && cp -a "$from" "$to" \
      && echo "copied from $from ($(date -u +%FT%TZ))" > "$to/COPIED_FROM" && echo "copied $from -> $to"
  fi
done
study --study=$chosen --up-to=3072 || exit $?
study --study=$chosen || exit $?
.venv/bin/python -m poad_jax.study --study=$chosen --report --publish=docs/results
study --study=studies/virtualhome_paper.py --up-to=1024 || exit $?
study --study=studies/virtualhome_paper.py || exit $?
.venv/bin/python -m poad_jax.study --study=studies/virtualhome_paper.py --report --publish=docs/results
study --study=$sweep || exit $?
.venv/bin/python scripts/paper_lr_rule.py --workdir=$runs/virtualhome_paper_lr --env-steps=3072
.venv/bin/python -m poad_jax.study --study=$sweep --report --publish=docs/results
