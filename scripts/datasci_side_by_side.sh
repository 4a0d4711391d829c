#!/usr/bin/env bash
# Issue 41's sitting: the default DataSciCoding job's loop (`bench e2e --config=configs/datasci.py`, 2 updates:
# one cold, one warm) on a checkout of the issue's base commit and on this one, alternating, with a background
# study paused (SIGSTOP) meanwhile and resumed at the end.  About 20-40 minutes per run on 2 cores.
#   BASE=/path/to/checkout-of-8f42db6 bash scripts/datasci_side_by_side.sh [out_dir] [rounds]
#   (git worktree add --detach ../base 8f42db6; docs/performance.md has the results)
set -u
cd "$(dirname "$0")/.."
HERE=$(pwd)
BASE=${BASE:?set BASE to a checkout of the base commit}
OUT=$(realpath -m "${1:-runs/datasci_side_by_side}")
ROUNDS=${2:-1}
mkdir -p "$OUT"
PAUSE=${PAUSE_PATTERN:-"poad_jax.study --study|poad_jax.train --config=/work/wt_study"}
pause() { pkill -STOP -f "$PAUSE"; }
resume() { pkill -CONT -f "$PAUSE"; }
trap resume EXIT
side() {  # name, checkout directory
  local name=$1 dir=$2
  pause; echo "== $name $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg) $(git -C "$dir" log --oneline -1 | cut -c1-60)" >> "$OUT/sitting.log"
  (cd "$dir" && "$HERE/.venv/bin/python" -m poad_jax.bench e2e --config=configs/datasci.py --updates=2) > "$OUT/$name.log" 2>&1
  echo "   $name: $(tail -1 "$OUT/$name.log" | cut -c1-400)" >> "$OUT/sitting.log"
}
lscpu | grep "Model name" >> "$OUT/sitting.log"
grep -o -w 'avx512_bf16\|amx_bf16\|avx512f\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ' >> "$OUT/sitting.log"; echo >> "$OUT/sitting.log"
for round in $(seq "$ROUNDS"); do
  side "base_r$round" "$BASE"
  side "new_r$round" "$HERE"
done
echo "== all done $(date -u +%T)" >> "$OUT/sitting.log"
