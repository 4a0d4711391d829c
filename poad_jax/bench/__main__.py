"""`python -m poad_jax.bench <name> [args]`: runs poad_jax.bench.<name>.main(args).

Every benchmark prints a table and, as its last line, one JSON object
`{"bench": <name>, ...}`.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import textwrap

import poad_jax.bench as bench_package


HELP = """\
usage: python -m poad_jax.bench NAME [--flag=value ...]

Runs one benchmark: it prints a table and, as its last line, one JSON object
{{"bench": NAME, ...}}. `python -m poad_jax.bench NAME --help` lists its flags;
docs/performance.md has every figure and the command that made it.

benchmarks:
{names}

examples:
  python -m poad_jax.bench backups                  # the BAD/GAE scan against a NumPy loop
  python -m poad_jax.bench e2e --config=configs/toy.py --updates=2
"""


def available() -> list[str]:
    return sorted(
        info.name
        for info in pkgutil.iter_modules(bench_package.__path__)
        if not info.name.startswith("_")
    )


def main(argv: list[str]) -> int:
    names = available()
    if not argv or argv[0] in ("-h", "--help"):
        print(HELP.format(names=textwrap.fill(", ".join(names), width=92, initial_indent="  ",
                                              subsequent_indent="  ")), end="")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in names:
        print(f"error: unknown benchmark {name!r}; available: {', '.join(names)}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"poad_jax.bench.{name}")
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
