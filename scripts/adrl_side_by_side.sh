#!/usr/bin/env bash
# Issue 31's sitting: the authors' loop (scripts/adrl_loop.sh, float32) and ours (bench e2e), alternating,
# with a background study paused (SIGSTOP) meanwhile and resumed at the end.  About 40 minutes on 2 cores.
#   bash scripts/adrl_side_by_side.sh [out_dir]     (docs/performance.md has the results table)
set -u
cd "$(dirname "$0")/.."
OUT=${1:-runs/side_by_side}
mkdir -p "$OUT"
PAUSE=${PAUSE_PATTERN:-"poad_jax.study --study|poad_jax.train --config=/work/runtree|run_virtualhome_paper.sh"}
pause() { pkill -STOP -f "$PAUSE"; }
resume() { pkill -CONT -f "$PAUSE"; }
trap resume EXIT
ours() {  # name, bench e2e arguments...
  local name=$1; shift
  pause; echo "== $name $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)" >> "$OUT/sitting.log"
  .venv/bin/python -m poad_jax.bench e2e "$@" > "$OUT/$name.log" 2>&1
  echo "   $name: $(tail -1 "$OUT/$name.log" | cut -c1-300)" >> "$OUT/sitting.log"
}
adrl() {  # name, VAR=value settings of scripts/adrl_loop.sh...
  local name=$1; shift
  pause; echo "== $name $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)" >> "$OUT/sitting.log"
  env NICE=0 "$@" bash scripts/adrl_loop.sh > "$OUT/$name.log" 2>&1
  echo "   $name: $(grep -a '^\[timing\]' "$OUT/$name.log" | tail -n +2 \
    | sed -E 's/.*total ([0-9.]+)s.*env_steps ([0-9]+).*/\1 \2/' \
    | awk '{t+=$1; s+=$2} END{printf "%.1f s per 1k env steps over %d warm updates", 1000*t/s, NR}')" >> "$OUT/sitting.log"
}
lscpu | grep "Model name" >> "$OUT/sitting.log"
git log --oneline -1 >> "$OUT/sitting.log"
VH="--config=configs/virtualhome.py --config.rollout_length=8 --updates=4"
for round in 1 2; do
  adrl "adrl_4x8_r$round" THREADS=4 EPISODE_LENGTH=8 EPOCHS=1 MINIBATCHES=4 UPDATES=4
  ours "ours_bf16_4x8_r$round" $VH
  ours "ours_f32_4x8_r$round" $VH --config.matmul_dtype=float32
  ours "ours_f32s_4x8_r$round" $VH --config.matmul_dtype=float32 --config.behaviour_logprobs=sampler
done
PRESET="--config=configs/virtualhome_paper.py:poad --updates=2"
adrl adrl_4x32 THREADS=4 EPISODE_LENGTH=32 EPOCHS=5 MINIBATCHES=2 UPDATES=2 ENTROPY_COEF=0.0001 GRAD_CP_STEPS=16
ours ours_bf16_4x32 $PRESET
ours ours_f32_4x32 $PRESET --config.matmul_dtype=float32
echo "== all done $(date -u +%T)" >> "$OUT/sitting.log"
