#!/usr/bin/env bash
# Issue 41's sitting: the default DataSciCoding job's loop (`bench e2e --config=configs/datasci.py`, 2 updates:
# one cold, one warm) on a checkout of the issue's base commit and on this one, alternating, with a background
# study paused (SIGSTOP) meanwhile and resumed at the end.  About 20-40 minutes per run on 2 cores.
#   BASE=/path/to/checkout-of-8f42db6 bash scripts/datasci_side_by_side.sh [out_dir] [rounds]
#   (git worktree add --detach ../base 8f42db6; docs/performance.md has the results)
# NEW_FIRST=1 runs this checkout first in each round.
# PRIMED=1: each side first runs once into a fresh persistent compilation cache of its own (`<side>_prime.log`),
# then is measured with that cache, so its updates load their programs instead of compiling them: the loop as a
# long run (or the train command's repeated run, which keeps a cache) sees it once its shapes have all been met.
set -u
cd "$(dirname "$0")/.."
HERE=$(pwd)
BASE=${BASE:?set BASE to a checkout of the base commit}
OUT=$(realpath -m "${1:-runs/datasci_side_by_side}")
ROUNDS=${2:-1}
PRIMED=${PRIMED:-0}
mkdir -p "$OUT"
PAUSE=${PAUSE_PATTERN:-"poad_jax.study --study|poad_jax.train --config=/work/wt_study"}
pause() { pkill -STOP -f "$PAUSE"; }
resume() { pkill -CONT -f "$PAUSE"; }
trap resume EXIT
bench() {  # log name, checkout directory
  echo "== $1 $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg) $(git -C "$2" log --oneline -1 | cut -c1-60)" >> "$OUT/sitting.log"
  (cd "$2" && "$HERE/.venv/bin/python" -m poad_jax.bench e2e --config=configs/datasci.py --updates=2) > "$OUT/$1.log" 2>&1
  echo "   $1: $(tail -1 "$OUT/$1.log" | cut -c1-400)" >> "$OUT/sitting.log"
}
side() {  # name, checkout directory
  pause
  if [ "$PRIMED" = 1 ]; then
    export JAX_COMPILATION_CACHE_DIR="$OUT/cache_$1" JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
    rm -rf "$JAX_COMPILATION_CACHE_DIR"
    bench "$1_prime" "$2"
  fi
  bench "$1" "$2"
  if [ "$PRIMED" = 1 ]; then
    rm -rf "$OUT/cache_$1"; unset JAX_COMPILATION_CACHE_DIR JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS
  fi
}
lscpu | grep "Model name" >> "$OUT/sitting.log"
grep -o -w 'avx512_bf16\|amx_bf16\|avx512f\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ' >> "$OUT/sitting.log"; echo >> "$OUT/sitting.log"
[ "$PRIMED" = 1 ] && echo "primed: each side measured with a persistent compilation cache its first run filled" >> "$OUT/sitting.log"
for round in $(seq "$ROUNDS"); do
  if [ "${NEW_FIRST:-0}" = 1 ]; then  # a second sitting in the other order cancels a steady drift of the machine
    side "new_r$round" "$HERE"; side "base_r$round" "$BASE"
  else
    side "base_r$round" "$BASE"; side "new_r$round" "$HERE"
  fi
done
echo "== all done $(date -u +%T)" >> "$OUT/sitting.log"
