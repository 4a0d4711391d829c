"""The agent, the shared math and the sampler read what their types declare: no probe.

A batch type carries every field it has (a token-level batch's `prefix_plan` may be None,
but it is declared), a credit scheme every attribute a method reads of it.  So in
`poad_jax/agent/`, `poad_jax/core/` and `poad_jax/sampling/` no `getattr` takes a default
and no `hasattr` asks: either would let a type forget a field silently.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("poad_jax/agent", "poad_jax/core", "poad_jax/sampling")


def probes(source: str) -> list[tuple[int, str]]:
    """(line, call) of every `getattr(x, name, default)` and `hasattr(x, name)` in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if (node.func.id == "getattr" and len(node.args) == 3) or node.func.id == "hasattr":
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_probe_finder_finds_probes():
    source = "a = getattr(batch, 'prefix_plan', None)\nb = getattr(batch, 'tokens')\nc = hasattr(scheme, 'x')\n"
    assert [line for line, _ in probes(source)] == [1, 3]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_attribute_probe(package):
    found = [f"{path.relative_to(ROOT)}:{line}: {call}"
             for path in sorted((ROOT / package).rglob("*.py")) for line, call in probes(path.read_text())]
    assert found == []
