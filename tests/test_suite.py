"""How the suite runs: `scripts/test.sh` hands whole `xdist_group` modules to one worker.

A module whose fixture takes minutes (a subprocess on 8 host devices, a
training run, the guide walked through) is marked
`pytestmark = pytest.mark.xdist_group(...)`; the mark does something only
under `--dist loadgroup`.  Without it pytest-xdist deals that module's tests
to both workers and each sets the fixture up.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_grouped_modules_run_on_one_worker():
    grouped = sorted(path.name for path in (ROOT / "tests").glob("test_*.py")
                     if re.search(r"^pytestmark = \[?pytest\.mark\.xdist_group\(", path.read_text(), re.M))
    assert {"test_guide.py", "test_sharding.py", "test_sharded_sampling.py", "test_sharding_fsdp.py"} <= set(grouped)
    command = [line for line in (ROOT / "scripts" / "test.sh").read_text().splitlines() if "pytest" in line
               and not line.lstrip().startswith("#")]
    assert any("-n 2" in line and "--dist loadgroup" in line for line in command), command


def test_the_first_tier_leaves_out_the_long_tests_and_ci_runs_both():
    """`scripts/test.sh` (the README's command) deselects the tests marked long; `--long` selects them alone;
    `.ci/run` runs the script both ways, so no test is left out of CI."""
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert 'first) select=(-m "not long")' in script and "long) select=(-m long)" in script
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'for tier in "" --long; do' in ci and "bash scripts/test.sh $tier" in ci
    marked = [path.name for path in (ROOT / "tests").glob("test_*.py") if "pytest.mark.long" in path.read_text()]
    assert {"test_sharding.py", "test_guide.py", "test_models_parity.py"} <= set(marked)


def test_loadgroup_sends_a_groups_tests_to_one_worker(tmp_path):
    """The mark works with the installed pytest and pytest-xdist (pytest 9 keeps a node's id where xdist 3.8
    cannot add its group, and every group was dealt to both workers: two model loads, two fixture setups)."""
    (tmp_path / "test_grouped.py").write_text(
        "import os\nimport pytest\n\npytestmark = pytest.mark.xdist_group('one')\n\n"
        + "".join(f"def test_{i}():\n    print('WORKER', os.environ['PYTEST_XDIST_WORKER'])\n\n" for i in range(6)))
    (tmp_path / "test_free.py").write_text("".join(f"def test_{i}():\n    pass\n\n" for i in range(6)))
    result = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p",
                             "no:cacheprovider", str(tmp_path)], capture_output=True, text=True, cwd=tmp_path,
                            timeout=120)
    assert result.returncode == 0, result.stdout[-2000:]
    workers = {line.split()[0] for line in result.stdout.splitlines() if "test_grouped.py::" in line
               and "PASSED" in line}
    assert len(workers) == 1, result.stdout[-2000:]
