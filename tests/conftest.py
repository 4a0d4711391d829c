"""Shared test fixtures.

`shared_dir` is the project's read-only `../shared` folder (datasets, env
oracle tables, model reference logits).  Tests that need it skip with a
clear reason when it is absent (e.g. a clone used outside this workplace).
"""

from __future__ import annotations

import os
import pathlib

import jax
import pytest

# The tests compare float32 results with float64 NumPy references at float32
# tolerances.  On GPUs XLA's default float32 matmul precision is TF32-like
# (about 1e-3 relative); ask for full float32 there (no effect on CPU).
jax.config.update("jax_default_matmul_precision", "highest")

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def _shared_dir() -> pathlib.Path | None:
    candidates = [os.environ.get("POAD_SHARED_DIR"), REPO_ROOT.parent / "shared"]
    for candidate in candidates:
        if candidate and pathlib.Path(candidate).is_dir():
            return pathlib.Path(candidate)
    return None


@pytest.fixture(scope="session")
def shared_dir() -> pathlib.Path:
    path = _shared_dir()
    if path is None:
        pytest.skip("../shared (datasets, env tables, model fixtures) is absent beside this checkout")
    return path


@pytest.fixture(scope="session")
def datasets_dir(shared_dir) -> pathlib.Path:
    return shared_dir / "datasets"
