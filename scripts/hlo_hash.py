"""Hashes of the one-device PPO update's HLO and of a seeded run's learning numbers.

    python scripts/hlo_hash.py [--methods poad,ntpo,twosome] [--updates 2] [--repo DIR]

Trains `configs/toy.py` (the tiny random model) for `--updates` updates per
method through the public command, `python -m poad_jax.train`, with XLA
dumping the modules whose name contains `update` as they are before XLA's
optimisations (the lowered HLO), and prints per method:

- `hlo`: sha256 of the compiled update's HLO text without its debug
  information (each op's `metadata={...}` and the module's stack-frame
  tables: source files, lines, function names), so moving code between
  files leaves it unchanged while any change to the computation changes it;
- `numbers`: sha256 of the run's metrics records without the fields that
  measure time or memory (what the run learned: losses, returns, KL, ...).

Each run uses a fresh compilation cache, so every update is compiled (and
dumped).  `--repo`: the checkout whose code runs (default: this one), so
that one script hashes two commits side by side.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
TOY_UPDATE_ENV_STEPS = 16  # configs/toy.py: 4 threads x 4 steps
METADATA = re.compile(r",?\s*metadata=\{[^}]*\}")
DEBUG_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
MACHINE_FIELDS = ("seconds_", "peak_rss_mb")


def stripped_hlo(text: str) -> str:
    """HLO text without debug information (per-op metadata, the stack-frame tables after
    the module's header line), which a file move changes, and with every instruction's and
    computation's name replaced by its rank of first appearance (`canonical_names`)."""
    kept, in_table = [], False
    for line in METADATA.sub("", text).split("\n"):
        if line in DEBUG_TABLES:
            in_table = True
        elif in_table and (not line or line.startswith(("%", "ENTRY"))):
            in_table = False
        if not in_table:
            kept.append(line)
    return canonical_names("\n".join(kept))


DEFINED = re.compile(r"^\s*(?:ROOT\s+)?%?([A-Za-z_][\w.\-]*)\s*=|^(?:ENTRY\s+)?%?([A-Za-z_][\w.\-]*)\s*[({]",
                     re.MULTILINE)


def canonical_names(text: str) -> str:
    """`text` with each name an instruction or a computation defines (with or without its `%`)
    written `n<k>`, k its rank of first definition: JAX names some instructions after the Python
    function that traced them (`ppo_update__locals__epoch.4`), so renaming or moving a function
    would change the text while the computation stays the same."""
    ranks: dict[str, str] = {}
    for match in DEFINED.finditer(text):
        ranks.setdefault(match.group(1) or match.group(2), f"n{len(ranks)}")
    if not ranks:
        return text
    names = re.compile(r"(?<![\w.\-])%?(" + "|".join(map(re.escape, sorted(ranks, key=len, reverse=True)))
                       + r")(?![\w.\-])")
    return names.sub(lambda m: ranks[m.group(1)], text)


def learned_numbers(records: list[dict]) -> list[dict]:
    """The records without the fields that measure the machine rather than the run."""
    return [{k: v for k, v in r.items() if not k.startswith(MACHINE_FIELDS)} for r in records]


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def hash_method(method: str, updates: int, scratch: pathlib.Path, repo: pathlib.Path) -> dict[str, str]:
    dump, workdir = scratch / f"dump-{method}", scratch / f"run-{method}"
    env = dict(os.environ, PYTHONPATH=str(repo), POAD_CACHE=str(scratch / f"cache-{method}"), JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_dump_to={dump} --xla_dump_hlo_module_re=.*update.* --xla_dump_hlo_as_text")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    command = [sys.executable, "-m", "poad_jax.train", "--config=configs/toy.py", f"--config.method={method}",
               f"--config.total_env_steps={updates * TOY_UPDATE_ENV_STEPS}", "--config.tensorboard=False",
               "--config.plot=False", f"--workdir={workdir}"]
    done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{method}: the training command failed:\n{done.stderr[-3000:]}")
    modules = sorted(p for p in dump.glob("*.before_optimizations.txt") if re.search(r"\.jit_update\.", p.name))
    if not modules:
        raise SystemExit(f"{method}: no jit_update module dumped in {dump}")
    texts = sorted(stripped_hlo(p.read_text()) for p in modules)
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {"hlo": sha("\n".join(texts)), "modules": str(len(texts)),
            "numbers": sha(json.dumps(learned_numbers(records), sort_keys=True))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", default="poad,ntpo,twosome")
    parser.add_argument("--updates", type=int, default=2)
    parser.add_argument("--repo", type=pathlib.Path, default=REPO, help="the checkout to run (default: this one)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        for method in args.methods.split(","):
            hashes = hash_method(method, args.updates, pathlib.Path(scratch), args.repo.resolve())
            print(f"{method:8s} hlo {hashes['hlo']} ({hashes['modules']} module) numbers {hashes['numbers']}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
