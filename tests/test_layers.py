"""The package's layers (docs/architecture.md) hold: imports only go down, and no circle.

- The import-linter contract in pyproject.toml (`[tool.importlinter]`)
  names the layers top to bottom; `lint-imports` fails on an import that
  climbs (imports inside functions count too).
- Every module of `poad_jax` belongs to a layer: a new top-level module or
  package must be placed in the contract.
- No import circle anywhere in the package, within a layer included
  (a strongly connected component of the import graph has one module),
  nor in `envs_py`.
"""

from __future__ import annotations

import os
import pathlib
import pkgutil
import subprocess
import sys
import tomllib

import grimp
import pytest

import poad_jax

REPO = pathlib.Path(__file__).resolve().parents[1]


def contract() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]


def test_the_layers_contract_holds():
    check = ("import sys; from importlinter.cli import lint_imports; "
             "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", check], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "1 kept, 0 broken" in done.stdout


def test_every_top_level_module_is_in_a_layer():
    layered = {name.strip() for layer in contract()["layers"] for name in layer.split("|")}
    top_level = {info.name for info in pkgutil.iter_modules(poad_jax.__path__)}
    assert top_level == layered, f"not in a layer: {sorted(top_level - layered)}; gone: {sorted(layered - top_level)}"


def strongly_connected(graph: grimp.ImportGraph, modules: list[str]) -> list[list[str]]:
    """The import graph's strongly connected components of more than one module among `modules` (Tarjan)."""
    among = set(modules)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in among:
                continue
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in modules:
        if module not in index:
            visit(module)
    return circles


def test_no_import_circle_in_the_package():
    graph = grimp.build_graph("poad_jax")
    modules = sorted(m for m in graph.modules if m.startswith("poad_jax"))
    assert len(modules) > 50  # the whole package was read
    assert strongly_connected(graph, modules) == []


def test_no_import_circle_in_the_environments():
    graph = grimp.build_graph("envs_py")
    modules = sorted(m for m in graph.modules if m.startswith("envs_py"))
    assert "envs_py.checks" in modules and "envs_py.interface" in modules
    assert strongly_connected(graph, modules) == []


def test_a_config_file_written_before_the_layers_still_loads_and_says_the_new_path(tmp_path):
    from poad_jax.run import config as config_lib

    old = tmp_path / "old_style.py"
    old.write_text("from poad_jax import config as poad_config\n\n\ndef get_config():\n"
                   "    config = poad_config.default_config()\n    config.name = 'old'\n    return config\n")
    with pytest.warns(FutureWarning, match=r"poad_jax\.run\.config"):
        loaded = config_lib.load_config_file(old)
    assert loaded.name == "old" and loaded.to_dict() == {**config_lib.default_config().to_dict(), "name": "old"}
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        import poad_jax

        poad_jax.no_such_name  # noqa: B018
