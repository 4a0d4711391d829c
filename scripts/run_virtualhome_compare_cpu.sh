#!/usr/bin/env bash
# Issue 40's study C (studies/virtualhome_compare.py) on a CPU, for sessions without a lent GPU: one cell at a
# time, the fresh seeds first (3, 4, then NTPO's 0-2); each cell's token policy is evaluated as soon as the cell
# finishes, while its checkpoints are still on this machine. Re-run the same command to go on; on another
# machine a cell that had not finished starts again (checkpoints stay on the machine), so start it with a
# cell's time left in the session: 50-80 minutes on a 2-core AMD EPYC with AVX-512 BF16 (POAD 15-17 s per update,
# TWOSOME about 25 s; 2026-11-27), about 5 hours on AVX2, where bfloat16 is emulated (there, wait for a GPU).
#   nohup bash scripts/run_virtualhome_compare_cpu.sh >> runs/studies/virtualhome_compare.log 2>&1 &
# Study B's seeds 0-2 of POAD and TWOSOME (raw snapshots of lent-H200 runs) are copied in as a sibling
# study's finished cells, which the runner reuses: they have the same configs (`... prior` copies them and
# stops; RUNS= another directory than runs/studies). C's own cells published by earlier sessions
# (docs/results/raw/cpu_<date>_compare, snapshot_studies.sh) are reused likewise. Each finished cell's token
# policy is played 20 episodes (evaluation_token.txt) and, for POAD and NTPO, whose sampler is another policy,
# the behaviour too (evaluation.txt), and an action-score cell's behaviour is set beside its token policy at
# the states it visits (scripts/behaviour_gap.py: behaviour_gap.md); `... evaluate` only does that (for a cell
# that finished while the runner was stopped). `... snapshot [DEST]` copies the small files of C's cells here,
# finished or still running, to DEST (default docs/results/raw/cpu_<today>_compare) for committing; the
# snapshots' finished cells are reused.
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-runs/studies}
python=${PYTHON:-.venv/bin/python}
raw=${RAW:-docs/results/raw}
place_finished_cells() {  # DEST CELL...: each published cell that finished, into DEST (a sibling study's cells)
  local dest=$1 cell
  shift
  mkdir -p "$dest"
  for cell in "$@"; do
    [ -f "$cell/finished.json" ] && [ ! -e "$dest/$(basename "$cell")" ] && cp -r "$cell" "$dest/"
  done
  ls "$dest" | wc -l
}
echo "prior cells beside study C: $(place_finished_cells "$runs/virtualhome_options/cells" \
  $raw/h200_2026-11-26/virtualhome_options_seed0/*__seed=* \
  $raw/h200_2026-11-26_seed{1,2}/virtualhome_options/*__seed=*)"
# C's own cells finished in earlier sessions (raw/cpu_<date>_compare): reused the same way, not trained again.
echo "study C's cells finished in earlier sessions: $(place_finished_cells "$runs/virtualhome_compare_published/cells" \
  $raw/cpu_*_compare/virtualhome_compare/*__seed=*)"
[ "${1:-}" = prior ] && exit 0
failed=" "  # tables whose evaluation failed in this invocation: not tried again every minute (re-run to retry)
evaluate_finished_cells() {  # the token policy (study C's docstring) and, where it is another, the behaviour
  local cell policy
  for cell in "$runs"/virtualhome_compare/cells/*/; do
    [ -f "$cell/finished.json" ] && [ -d "$cell/checkpoints" ] || continue
    for policy in token behaviour; do  # TWOSOME's behaviour is its token policy: played once
      [ $policy = behaviour ] && grep -q '"method": "twosome"' "$cell/config.json" && continue
      table=$cell/evaluation.txt
      [ $policy = token ] && table=$cell/evaluation_token.txt
      [ -f "$table" ] || [[ "$failed" == *" $table "* ]] && continue
      if "$python" -m poad_jax.evaluate --workdir="$cell" --policy=$policy --mode=sampled --episodes=20 \
          > "$cell/evaluate_$policy.log" 2>&1; then
        echo "$(basename "$cell") $policy $(tail -n +3 "$table")"
      else
        failed+="$table "
        echo "$(basename "$cell") $policy: evaluation failed, see $cell/evaluate_$policy.log" >&2
      fi
    done
    measure_behaviour_gap "$cell"
  done
}
measure_behaviour_gap() {  # CELL: an action-score cell's behaviour against its token policy, once
  local cell=${1%/} report=${1%/}/behaviour_gap.md
  grep -q '"restricted_sampling": "action_scores"' "$cell/config.json" || return 0
  [ -f "$report" ] || [[ "$failed" == *" $report "* ]] && return 0
  if "$python" scripts/behaviour_gap.py --workdir="$cell" --episodes=20 --initial --out="$cell" \
      > "$cell/behaviour_gap.log" 2>&1
  then
    echo "$(basename "$cell") behaviour gap: $(sed -n 3p "$report" | cut -d. -f1)"
  else
    failed+="$report "
    echo "$(basename "$cell") behaviour gap: failed, see $cell/behaviour_gap.log" >&2
  fi
}
[ "${1:-}" = evaluate ] && { evaluate_finished_cells; evaluate_finished_cells; [ "$failed" = " " ]; exit; }
snapshot_cells() {  # DEST: the small files of C's cells here (finished or not) via snapshot_studies.sh, except
  local dest=${1%/} staging cell name  # one published finished in another snapshot or reused from B (one copy)
  staging=$runs/.snapshot_staging  # hard links (cp -l) on the runs' own file system: no checkpoint is copied
  rm -rf "$staging" && mkdir -p "$staging/virtualhome_compare/cells"
  cp "$runs/virtualhome_compare/study.json" "$staging/virtualhome_compare/"
  for cell in "$runs"/virtualhome_compare/cells/*/; do
    name=$(basename "$cell")
    [ -L "${cell%/}" ] && continue  # a cell reused from a sibling study (B): published with it
    ls -d "$raw"/cpu_*_compare/virtualhome_compare/"$name"/finished.json 2>/dev/null | grep -v "^$dest/" >/dev/null && continue
    cp -rl "$cell" "$staging/virtualhome_compare/cells/$name"
  done
  bash scripts/snapshot_studies.sh "$staging" "$dest"
  rm -rf "$staging"
}
[ "${1:-}" = snapshot ] && { snapshot_cells "${2:-$raw/cpu_$(date -u +%F)_compare}"; exit; }
for seed in 3 4 0 1 2; do
  "$python" -m poad_jax.study --study=studies/virtualhome_compare.py --workdir="$runs/virtualhome_compare" \
    --seeds=$seed &
  study=$!
  while kill -0 $study 2>/dev/null; do evaluate_finished_cells; sleep 60; done
  wait $study || exit $?
  evaluate_finished_cells
done
"$python" -m poad_jax.study --study=studies/virtualhome_compare.py --workdir="$runs/virtualhome_compare" \
  --report --publish=docs/results
