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
