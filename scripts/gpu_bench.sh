#!/usr/bin/env bash
# GPU-scale benchmarks with random weights of LLaMA-7B shapes, for a machine
# with an NVIDIA GPU whose python3 already has jax with CUDA (the device
# machines lent to this project: no registry there, so nothing is installed
# from PyPI).  The machine's own jax and flax are used (flax 0.12.8, which
# the CPU set-up pins, needs jax <= 0.10); only if its flax cannot be
# imported is a carried wheel in .gpu_wheels/ tried.
#
#   bash scripts/gpu_bench.sh [OUTDIR]     (logs and JSON lines go to OUTDIR)
#   PARTS="generate tests" bash scripts/gpu_bench.sh   (a subset: generate, train, tests, sharded)
#
# Runs: the sampler at batch 1, 16 and 64 (tokens/s, decode step time, read
# bandwidth), with unstacked (default) and scanned layer weights, the PPO LoRA update at 16 and 64 rows of 256 tokens (MFU), and
# the model and sampler tests on the GPU (one pytest per file); sharded: the compiled update's
# memory per device on every mesh the node's GPUs can form (7B and 34B shapes,
# `bench memory_mesh`) and the mesh tests (tests/test_sharding.py, which run
# on 8 emulated CPU devices in their own process, so any machine runs them).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/poad_gpu_bench}}
mkdir -p "$out"
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
flax_version=$($PY -c "import flax; print(flax.__version__)" 2>/dev/null || echo none)
wheel=$(ls .gpu_wheels/flax-0.12.8-*.whl 2>/dev/null | head -1)
site=""
echo "machine's flax: $flax_version"
if ! $PY -c "from flax import nnx" 2>/dev/null && [ -n "$wheel" ]; then
  site=$(mktemp -d)
  $PY -m pip install -q --no-deps --target "$site" "$wheel"
fi
export PYTHONPATH="$PWD${site:+:$site}${PYTHONPATH:+:$PYTHONPATH}"
$PY -c "import jax, flax, optax, chex; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'chex', chex.__version__, jax.devices())"
export PYTHONUNBUFFERED=1

parts=" ${PARTS:-generate train tests sharded} "  # which groups to run, e.g. PARTS="generate tests"
run() {  # name, then the command; skipped unless the name's group is in $parts
  local name=$1; shift
  [[ "$parts" == *" ${name%%_*} "* || ("$parts" == *" train "* && $name == train_step*) ]] || return 0
  echo "== $name: $*"
  "$@" 2>&1 | tee "$out/$name.log"
}
run generate_7b $PY -m poad_jax.bench generate --shape=llama-7b --sides=jax --dtype=bfloat16 \
  --batch=1,16,64 --prompt-tokens=100 --new-tokens=128 --repeats=3 --peak-gbs=${PEAK_GBS:-3350}
run generate_7b_scanned $PY -m poad_jax.bench generate --shape=llama-7b --sides=jax --dtype=bfloat16 \
  --batch=1,16,64 --prompt-tokens=100 --new-tokens=128 --repeats=3 --peak-gbs=${PEAK_GBS:-3350} --scan-layers
run train_step_7b_rows16 $PY -m poad_jax.bench train_step --shape=llama-7b --sides=jax --dtype=bfloat16 \
  --rows=16 --threads=4 --rounds=1 --steps=3 --peak-tflops=${PEAK_TFLOPS:-989}
run train_step_7b_rows64 $PY -m poad_jax.bench train_step --shape=llama-7b --sides=jax --dtype=bfloat16 \
  --rows=64 --threads=4 --rounds=1 --steps=3 --peak-tflops=${PEAK_TFLOPS:-989}
# One pytest per file, so that a failure's message is printed when its file ends, not lost with the rest
# when a device call's time runs out (2026-11-28: 45 of 69 tests in 140 s on an H200, one failure unseen).
for file in models_llama sampling models_precision backups; do
  run tests_$file $PY -m pytest -q -p no:cacheprovider --tb=short tests/test_$file.py
done
gpus=$($PY -c "import jax; print(jax.device_count())")
meshes7=1x1x1; meshes34=1x1x1
if [ "$gpus" -ge 8 ]; then meshes7=1x1x1,8x1x1,1x8x1,2x4x1,1x4x2; meshes34=1x8x1,2x4x1,1x4x2; fi
run sharded_memory_7b $PY -m poad_jax.bench memory_mesh --models=llama-7b --meshes=$meshes7
run sharded_memory_34b $PY -m poad_jax.bench memory_mesh --models=codellama-34b --meshes=$meshes34
run sharded_tests $PY -m pytest -q -p no:cacheprovider tests/test_sharding.py
