#!/usr/bin/env bash
# Issue 44's DataSciCoding comparison (studies/datasci_poad_ntpo.py), the CPU route: about 40 hours on 2 cores,
# one cell at a time; resumable: re-run the same command after any interruption, on the same machine
# (checkpoints live in runs/).
#   nohup bash scripts/run_datasci_study.sh >> runs/studies/datasci.log 2>&1 &
# 1. The sweep's two seed-0 cells at the chosen rate (studies/datasci_lr.py, its rule applied by
#    scripts/paper_lr_rule.py) are copied in as the comparison's POAD and NTPO seed-0 cells' first 64 env
#    steps (same config and seed; only total_env_steps and the output setting log_actions differ), once.
# 2. Seed 0 to 256 env steps, and the study file's contingency checked on it.
# 3. Every cell to 1,000 env steps, seed-major; then its report, published to docs/results.
set -uo pipefail
cd "$(dirname "$0")/.."
runs=runs/studies
study_file=studies/datasci_poad_ntpo.py
rate=$(.venv/bin/python -c "import runpy; print(runpy.run_path('$study_file')['CHOSEN_ACTOR_LR'])") || exit 2
for method in POAD NTPO; do
  to=$runs/datasci_poad_ntpo/cells/${method}__seed=0
  [ -e "$to" ] && continue
  for sweep in datasci_lr datasci_lr_decisive; do
    from=$runs/$sweep/cells/actor_lr=${rate}__${method}__seed=0
    if grep -qs '"env_steps": 64' "$from/finished.json"; then
      from=$(readlink -f "$from")  # a cell the sweep reused from its sibling: the files themselves
      mkdir -p "$(dirname "$to")" && cp -a "$from" "$to" \
        && echo "copied from $from ($(date -u +%FT%TZ))" > "$to/COPIED_FROM" && echo "copied $from -> $to"
      break
    fi
  done
done
# 2. The contingency in the study file's docstring: seed 0 to 256 env steps first; stop if neither method has a
#    program that ran in its last 64 env steps.
.venv/bin/python -m poad_jax.study --study=$study_file --seeds=0 --up-to=256 || exit $?
.venv/bin/python - "$runs/datasci_poad_ntpo/cells" <<'PY' || exit $?
import pathlib, sys
from poad_jax.run.metrics import read_metrics
cells = pathlib.Path(sys.argv[1])
ran = {}
for method in ("POAD", "NTPO"):
    records = read_metrics(cells / f"{method}__seed=0" / "metrics.jsonl")
    ran[method] = sum(int(r.get("steps_succeeded") or 0) for r in records if 192 < int(r["env_steps"]) <= 256)
print("programs that ran in env steps 193-256 of seed 0:", ran)
if not any(ran.values()):
    print("contingency: the rate broke the policy; the comparison moves to the sweep's next lower qualifying rate "
          "(studies/datasci_poad_ntpo.py, its docstring)")
    sys.exit(3)
PY
# 3. Every cell to 1,000 env steps, seed-major; then the report, published to docs/results.
.venv/bin/python -m poad_jax.study --study=$study_file || exit $?
.venv/bin/python -m poad_jax.study --study=$study_file --report --publish=docs/results
