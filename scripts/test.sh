#!/usr/bin/env bash
# Runs the test suite (after set-up), in two tiers:
#   bash scripts/test.sh           the first tier: every test not marked `long` (within 15 minutes on a quiet
#                                  2-core CPU from an empty compilation cache; docs/setup.md)
#   bash scripts/test.sh --long    the second tier alone: the `long` tests (eight-device meshes, several
#                                  processes, the embedded models, whole training runs)
#   bash scripts/test.sh --all     both tiers in one pytest run
# Further arguments go to pytest.  It ends with the slowest tests (`--durations`).
set -euo pipefail
cd "$(dirname "$0")/.."
tier=first
case "${1:-}" in
  --long) tier=long; shift ;;
  --all) tier=all; shift ;;
esac
case "$tier" in
  first) select=(-m "not long"); echo "test.sh: the first tier (tests not marked long; the second: bash scripts/test.sh --long)" ;;
  long) select=(-m long); echo "test.sh: the second tier (tests marked long)" ;;
  all) select=(); echo "test.sh: both tiers" ;;
esac
bash scripts/setup.sh
# The bench extra (torch, peft): the test that loads an exported adapter with PEFT needs it (about 20 s, once).
# Where it cannot be installed, that one test says so and skips; the rest runs.
.venv/bin/python -c "import peft, torch" 2>/dev/null || .venv/bin/python -m pip install -q -e ".[bench]" \
  || echo "test.sh: warning: could not install the bench extra; the PEFT loading test will skip" >&2
export POAD_SHARED_DIR=${POAD_SHARED_DIR:-$(cd .. && pwd)/shared}
# XLA compilations are cached on disk and shared by the test processes.
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$HOME/.cache/poad_jax/jax}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=${JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS:-0.5}
# --dist loadgroup: a module marked `xdist_group` (one whose module fixture takes minutes) runs on one worker,
# so that fixture is set up once, not once per worker that draws one of its tests.
exec .venv/bin/python -m pytest -n 2 --dist loadgroup --durations=15 "${select[@]}" "$@" tests
