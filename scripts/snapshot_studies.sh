#!/usr/bin/env bash
# Copies the paper-task studies' small per-cell files (metrics.jsonl, config.json,
# cell.json, finished.json, a COPIED_FROM note, DataSciCoding's best program, the evaluate
# tables evaluation.txt and evaluation_token.txt, behaviour_gap.md with its steps, and the logged
# actions) and each
# study.json into docs/results/raw/ (a cell reused from a sibling study gets a
# REUSED note instead), so the numbers in docs/results/ survive a lost
# machine. Checkpoints are not copied. The logs (*.jsonl: metrics, actions, behaviour gap steps) are stored
# gzipped, `python -m poad_jax.tools.rawlogs pack` (docs/results/raw/README.md): metrics.jsonl.gz, ...
#   bash scripts/snapshot_studies.sh [RUNS_DIR [DEST]]   (defaults: runs/studies, docs/results/raw)
#   PYTHON=.venv/bin/python bash scripts/snapshot_studies.sh ...   (the python that packs; default python3)
# A study run elsewhere keeps its own DEST, e.g. the lent GPU's runs:
#   bash scripts/snapshot_studies.sh runs/studies_gpu docs/results/raw/h100_2026-11-25
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-runs/studies}"
dest="${2:-docs/results/raw}"
[ -d "$runs" ] || { echo "error: no study directory $runs" >&2; exit 2; }
for study_dir in "$runs"/*/; do
  study=$(basename "$study_dir")
  [ -f "$study_dir/study.json" ] || continue
  mkdir -p "$dest/$study"
  cp "$study_dir/study.json" "$dest/$study/"
  for cell_dir in "$study_dir"cells/*/; do
    [ -f "$cell_dir/metrics.jsonl" ] || continue
    target="$dest/$study/$(basename "$cell_dir")"
    mkdir -p "$target"
    if [ -L "${cell_dir%/}" ]; then  # reused from a sibling study, whose snapshot holds its files
      echo "reused: $(readlink "${cell_dir%/}")" > "$target/REUSED"
      continue
    fi
    # The actions a run logged (log_actions) are about 2 kB per DataSciCoding env step as text: packed below.
    for name in metrics.jsonl config.json cell.json finished.json best_program.json best_program.py COPIED_FROM \
                evaluation.txt evaluation_token.txt behaviour_gap.md actions.jsonl behaviour_gap_steps.jsonl; do
      [ -f "$cell_dir/$name" ] && cp "$cell_dir/$name" "$target/"
    done
  done
  "${PYTHON:-python3}" -m poad_jax.tools.rawlogs pack "$dest/$study" > /dev/null
  echo "$study: $(ls -d "$dest/$study"/*/ 2>/dev/null | wc -l) cells copied"
done
