"""`python -m poad_jax.bench <name> [args]`: runs poad_jax.bench.<name>.main(args).

Every benchmark prints a table and, as its last line, one JSON object
`{"bench": <name>, ...}`.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import poad_jax.bench as bench_package


def available() -> list[str]:
    return sorted(
        info.name
        for info in pkgutil.iter_modules(bench_package.__path__)
        if not info.name.startswith("_")
    )


def main(argv: list[str]) -> int:
    names = available()
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m poad_jax.bench <name> [args]\nbenchmarks: " + ", ".join(names))
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in names:
        print(f"error: unknown benchmark {name!r}; available: {', '.join(names)}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"poad_jax.bench.{name}")
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
