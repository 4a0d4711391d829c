"""Every relative link in README.md and docs/*.md leads somewhere: the file exists and, for a
`#anchor`, the target file has a heading with that anchor (GitHub's rule)."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def github_anchor(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation other than '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    """The anchors of a markdown file's headings (outside code fences), with GitHub's -1, -2 for repeats."""
    seen: dict[str, int] = {}
    out, fenced = set(), False
    for line in path.read_text().splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if fenced or not line.startswith("#"):
            continue
        base = github_anchor(line.lstrip("#"))
        count = seen.get(base, 0)
        out.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return out


def links(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line number, target) of each relative markdown link outside code fences."""
    found, fenced = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if fenced:
            continue
        for target in LINK.findall(line):
            if not re.match(r"^[a-z]+:", target):
                found.append((number, target))
    return found


def test_github_anchor_rule():
    assert github_anchor(" The default job: `python -m poad_jax.train --config=configs/datasci.py`") == \
        "the-default-job-python--m-poad_jaxtrain---configconfigsdatascipy"
    assert github_anchor("Where λ applies (`ppo.lambda_scope`)") == "where-λ-applies-ppolambda_scope"


@pytest.mark.parametrize("doc", ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))])
def test_relative_links_resolve(doc):
    path = ROOT / doc
    broken = []
    for number, target in links(path):
        file_part, _, anchor = target.partition("#")
        destination = (path.parent / file_part).resolve() if file_part else path
        if not destination.exists():
            broken.append(f"{doc}:{number}: {target} (no such file)")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{doc}:{number}: {target} (no heading with that anchor)")
    assert not broken, "\n".join(broken)
