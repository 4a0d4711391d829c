#!/usr/bin/env bash
# Runs the whole test suite (after set-up).  Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export POAD_SHARED_DIR=${POAD_SHARED_DIR:-$(cd .. && pwd)/shared}
exec .venv/bin/python -m pytest -n 2 --durations=15 "$@" tests
