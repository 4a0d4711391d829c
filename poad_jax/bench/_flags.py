"""Flag parsing shared by the absl-based benchmarks (`e2e`, `logprob_gap`)."""

from __future__ import annotations

import sys

HELP_FLAGS = ("-h", "--help", "-help", "--helpfull", "--helpshort")


def parse_or_report(parse, argv: list[str], doc: str = ""):
    """`parse(argv)`, or None after printing its error in one line (the caller exits with status 2).

    absl's flag errors and a config file that fails to load both arrive as exceptions; a user
    mistake must not end in a traceback.  `--help` prints the benchmark's `doc` (its module
    docstring: what it measures and its command) and its flags with their defaults, and exits 0."""
    if any(arg in HELP_FLAGS for arg in argv):
        values = parse([])
        name = parse.__module__.rpartition(".")[2]  # poad_jax.bench.e2e -> e2e
        print(f"usage: python -m poad_jax.bench {name} [--flag=value ...]\n")
        if doc:
            print(doc.strip() + "\n")
        print("flags:")
        for flag in sorted(values, key=str):
            item = values[flag]
            print(f"  --{flag}={item.default_as_str if item.default_as_str is not None else ''}".ljust(36)
                  + f" {item.help}")
        sys.exit(0)
    try:
        values = parse(argv)
        if "config" in values and values.config is not None:
            values.config.keys()  # config_flags raises a file's load error at its first use: here, not mid-run
        return values
    except Exception as error:  # noqa: BLE001 - absl's flag errors of every kind
        print("error: " + " ".join(line.strip() for line in str(error).splitlines()), file=sys.stderr)
        return None
