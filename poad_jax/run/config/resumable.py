"""Which fields a re-run of a run directory may change, and what a change affects.

Each such setting says so in its declaration (`setting(..., resumable="speed")`, a whole section
`section(..., resumable="layout")`; the kinds are `poad_jax.declare.Resumable`), and
`RESUMABLE_FIELDS` is derived from the declarations: a dotted name covers its sub-tree ("mesh"
covers "mesh.data").  The trainer refuses any other change in a directory with checkpoints; the
study runner lets a cell's settings change in these fields, and reuses another study's finished cell
that differs only in the fields whose change leaves the numbers as they are (`SAME_NUMBERS`).
"""

from __future__ import annotations

from poad_jax.declare import resumable_settings
from poad_jax.run.config.settings import Run

RESUMABLE_FIELDS: dict[str, str] = resumable_settings(Run)  # {dotted name: what a change affects}
SAME_NUMBERS = ("length", "outputs")  # a change of these kinds leaves every logged number as it was


def resumable_kind(dotted: str) -> str | None:
    """What a change of field `dotted` affects (`RESUMABLE_FIELDS`), or None if a re-run may not change it."""
    for name, kind in RESUMABLE_FIELDS.items():
        if dotted == name or dotted.startswith(name + "."):
            return kind
    return None
