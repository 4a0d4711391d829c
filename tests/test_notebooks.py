"""Every committed notebook runs top to bottom and is committed without outputs.

Each `notebooks/*.ipynb` is executed with nbclient in a fresh `python3`
kernel (jupyter_client launches it with this interpreter, i.e. the venv's
python; a probe cell checks `sys.prefix`), working directory = the repository root, so any cell error fails
the test.  The notebooks' own `assert`s turn their numerical claims into
checks.
"""

from __future__ import annotations

import os
import pathlib
import sys

import pytest

pytestmark = pytest.mark.long  # the suite's second tier (scripts/test.sh --long)

nbformat = pytest.importorskip("nbformat", reason="nbformat is a dev extra")
nbclient = pytest.importorskip("nbclient", reason="nbclient is a dev extra")

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 120


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/*.ipynb not found"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs_and_starts_with_the_colab_cell(path):
    notebook = nbformat.read(path, as_version=4)
    first = notebook.cells[0]
    assert first.cell_type == "code" and "google.colab" in first.source, (
        f"{path.name}: the first cell must install the package when run in Colab (and do nothing elsewhere)"
    )
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type == "code":
            assert not cell.get("outputs"), f"{path.name} cell {index} has outputs: strip them"
            assert cell.get("execution_count") is None, f"{path.name} cell {index} has an execution count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path, monkeypatch):
    # The kernel inherits this environment: a non-interactive matplotlib
    # backend, and the repository on the path even without `pip install -e`.
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    notebook = nbformat.read(path, as_version=4)
    # A last cell proves the kernel was this interpreter (the venv's).
    probe = nbformat.v4.new_code_cell("import sys; print(sys.prefix)")
    notebook.cells.append(probe)
    client = nbclient.NotebookClient(
        notebook,
        kernel_name="python3",
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(REPO_ROOT)}},
    )
    client.execute()
    printed = "".join(output.get("text", "") for output in probe.outputs).strip()
    assert printed == sys.prefix, f"kernel ran in {printed}, not in this environment {sys.prefix}"
