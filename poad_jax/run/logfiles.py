"""A run's text logs as stored plain or gzipped: one reader for both.

A run writes its logs plain (`metrics.jsonl`, `actions.jsonl`); the repository's raw snapshots
(docs/results/raw) keep them gzipped beside their name (`metrics.jsonl.gz`, written by
`python -m poad_jax.tools.rawlogs pack DIR`). Every reader goes through `read_log_text`, so a
report, a test or a script reads a snapshot as it reads a live run directory. Where both exist,
the plain file is the log: a run appending to it is newer than any packed copy.
"""

from __future__ import annotations

import gzip
import pathlib

PACKED_SUFFIX = ".gz"


def packed_path(path: str | pathlib.Path) -> pathlib.Path:
    """Where `path` lies when stored gzipped: `metrics.jsonl` -> `metrics.jsonl.gz`."""
    path = pathlib.Path(path)
    return path.with_name(path.name + PACKED_SUFFIX)


def stored_log(path: str | pathlib.Path) -> pathlib.Path | None:
    """The file that holds the log `path`: `path` itself, else its gzipped copy; None without either."""
    path = pathlib.Path(path)
    for candidate in (path, packed_path(path)):
        if candidate.is_file():
            return candidate
    return None


def read_log_text(path: str | pathlib.Path) -> str | None:
    """The text of the log `path`, read from `path` or, failing that, from `path.gz`; None without either."""
    stored = stored_log(path)
    if stored is None:
        return None
    if stored == pathlib.Path(path):
        return stored.read_text()
    return gzip.decompress(stored.read_bytes()).decode("utf-8")
