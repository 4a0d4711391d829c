"""Shared test fixtures.

`shared_dir` is the project's read-only `../shared` folder (datasets, env
oracle tables, model reference logits).  Tests that need it skip with a
clear reason when it is absent (e.g. a clone used outside this workplace).

Memory: after each module the worker collects its garbage and hands freed
heap back to the system, so one module's models do not stay resident under
the next; the run ends with each worker's peak resident memory (the suite's
budget is 8 GB for both workers together; docs/setup.md).
"""

from __future__ import annotations

import ctypes
import gc
import os
import pathlib
import resource

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


@pytest.fixture(scope="module", autouse=True)
def _release_memory_after_each_module():
    yield
    gc.collect()
    try:  # glibc keeps freed heap mapped; malloc_trim returns it, so the next module starts from less
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


PEAKS = pytest.StashKey[dict]()
RAISES = pytest.StashKey[list]()  # (GB the test raised its process's peak to, test id): where the peak comes from
RAISE_REPORTED_GB = 0.5  # a test that raises its worker's peak by less is not named


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    before = _peak_rss_mb(resource.RUSAGE_SELF)
    result = yield
    after = _peak_rss_mb(resource.RUSAGE_SELF)
    if after - before >= RAISE_REPORTED_GB * 1024:
        item.config.stash[RAISES].append((round(after / 1024, 1), item.nodeid))
    return result


def _peak_rss_mb(who: int) -> float:
    return resource.getrusage(who).ru_maxrss / 1024  # Linux reports KiB


def pytest_configure(config):
    config.stash[PEAKS] = {}
    config.stash[RAISES] = []


def pytest_sessionfinish(session):
    output = getattr(session.config, "workeroutput", None)  # set on a pytest-xdist worker
    if output is not None:
        output["peak_rss_mb"] = _peak_rss_mb(resource.RUSAGE_SELF)
        output["peak_raises"] = session.config.stash[RAISES]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    output = getattr(node, "workeroutput", {})
    if "peak_rss_mb" in output:
        node.config.stash[PEAKS][node.gateway.id] = output["peak_rss_mb"]
        node.config.stash[RAISES].extend((gb, f"{node.gateway.id} {test}") for gb, test in output["peak_raises"])


def pytest_terminal_summary(terminalreporter, config):
    peaks = config.stash[PEAKS] or {"this process": _peak_rss_mb(resource.RUSAGE_SELF)}
    workers = ", ".join(f"{name} {own / 1024:.1f} GB" for name, own in sorted(peaks.items()))
    together = sum(peaks.values()) / 1024
    # (ru_maxrss of the subprocesses is not shown: the kernel carries a parent's size across exec into it)
    terminalreporter.write_line(f"peak resident memory: {workers}; at most {together:.1f} GB together")
    for gb, test in sorted(config.stash[RAISES], reverse=True)[:5]:
        terminalreporter.write_line(f"  raised its process's peak to {gb:.1f} GB: {test}")
