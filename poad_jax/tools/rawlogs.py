"""Raw logs stored compressed: `python -m poad_jax.tools.rawlogs pack DIR [DIR ...]`.

Gzips every JSON-lines log under each DIR in place (`metrics.jsonl` -> `metrics.jsonl.gz`, likewise
`actions.jsonl`, `behaviour_gap_steps.jsonl`), deterministically (level 9, no name, mtime 0: packing
the same text again gives the same bytes, so a re-snapshot of an unchanged cell changes nothing in
git), and removes the plain file. The small files (config.json, cell.json, study.json, notes, the
few-kB `*.log` and `*.txt` tables) stay plain. The readers (`poad_jax.run.logfiles.read_log_text`:
`read_metrics`, `read_actions`, a study's report) read either form; `zcat metrics.jsonl.gz` or
`python -m gzip -d metrics.jsonl.gz` gives the text back. docs/results/raw/README.md says why.
"""

from __future__ import annotations

import argparse
import gzip
import io
import pathlib
import sys

from poad_jax.run.logfiles import packed_path

PACKED_PATTERN = "*.jsonl"  # the logs: one record per update or env step, hundreds of kB a cell
PLAIN_LIMIT_BYTES = 64 * 1024  # no plain file of a raw snapshot is larger (tests/test_rawlogs.py)


def gzipped(data: bytes) -> bytes:
    """`data` gzipped the same way every time (no file name, mtime 0, level 9; through `GzipFile`, whose
    header is the same in every Python, where `gzip.compress`'s OS byte changed in 3.12)."""
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=buffer, mtime=0) as packed:
        packed.write(data)
    return buffer.getvalue()


def pack_file(path: pathlib.Path) -> pathlib.Path:
    """Writes `path` gzipped beside it (atomically), removes `path`; returns the packed file."""
    packed = packed_path(path)
    temporary = packed.with_name(packed.name + ".tmp")
    temporary.write_bytes(gzipped(path.read_bytes()))
    temporary.replace(packed)
    path.unlink()
    return packed


def logs_to_pack(directory: pathlib.Path) -> list[pathlib.Path]:
    """The plain JSON-lines logs under `directory` (symlinks not followed: a reused cell's files are
    its own study's)."""
    return sorted(path for path in directory.rglob(PACKED_PATTERN) if path.is_file() and not path.is_symlink())


def pack(directory: pathlib.Path) -> list[pathlib.Path]:
    """Packs every log under `directory`; returns the packed files."""
    return [pack_file(path) for path in logs_to_pack(directory)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m poad_jax.tools.rawlogs",
                                     description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack", help="gzip every *.jsonl under each DIR in place")
    packing.add_argument("directories", nargs="+", type=pathlib.Path, metavar="DIR")
    args = parser.parse_args(argv)
    missing = [str(d) for d in args.directories if not d.is_dir()]
    if missing:
        print(f"error: not a directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    for directory in args.directories:
        before = sum(path.stat().st_size for path in logs_to_pack(directory))
        packed = pack(directory)
        after = sum(path.stat().st_size for path in packed)
        print(f"{directory}: {len(packed)} logs packed, {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
