"""`scripts/hlo_hash.py` hashes what the update computes, not what its Python functions are called."""

from __future__ import annotations

import importlib.util
import pathlib

import jax
import jax.numpy as jnp

_SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "hlo_hash.py"
_spec = importlib.util.spec_from_file_location("hlo_hash", _SCRIPT)
hlo_hash = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hlo_hash)


def doubled_sine(x):
    return jnp.sin(x) * 2.0


def renamed_doubled_sine(x):
    return jnp.sin(x) * 2.0


def doubled_cosine(x):
    return jnp.cos(x) * 2.0


def hlo_text(inner) -> str:
    """The HLO text of a function that calls `inner` as its own computation (named after it)."""
    outer = lambda x: jax.jit(inner)(x) + 1.0
    return jax.jit(outer).lower(jnp.ones((3,), jnp.float32)).compiler_ir("hlo").as_hlo_text()


def test_renaming_a_function_leaves_the_hash_and_changing_its_computation_does_not():
    same, renamed, changed = (hlo_text(f) for f in (doubled_sine, renamed_doubled_sine, doubled_cosine))
    assert "doubled_sine" in same and "renamed_doubled_sine" in renamed and same != renamed  # the names differ
    assert hlo_hash.stripped_hlo(same) == hlo_hash.stripped_hlo(renamed)
    assert hlo_hash.stripped_hlo(same) != hlo_hash.stripped_hlo(changed)
    assert hlo_hash.stripped_hlo(same.replace("f32[3]", "f32[4]")) != hlo_hash.stripped_hlo(same)
