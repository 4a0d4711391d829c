"""Flag parsing shared by the absl-based benchmarks (`e2e`, `logprob_gap`)."""

from __future__ import annotations

import sys


def parse_or_report(parse, argv: list[str]):
    """`parse(argv)`, or None after printing its error in one line (the caller exits with status 2).

    absl's flag errors and a config file that fails to load both arrive as exceptions; a user
    mistake must not end in a traceback."""
    try:
        return parse(argv)
    except Exception as error:  # noqa: BLE001 - absl's flag errors of every kind
        print(f"error: {error}", file=sys.stderr)
        return None
