"""Study B's first pass on a CPU: seed 0 of every variant of `studies/virtualhome_options.py`, new options first.

The same cells as study B (the same settings, the same names), seed 0 only,
in the order that tells most soonest on a 2-core machine: the four POAD
options, then TWOSOME's four variants, then the two defaults, whose settings
`studies/virtualhome.py` and `studies/virtualhome_sampling.py` already ran
(their raw logs are in docs/results/raw/).  Study B reuses every finished
cell of this pass, so nothing here is run twice.  The plan and decision rule
are study B's (its docstring): one seed decides nothing; this pass shows
which options are worth B's three seeds and C's five first.

    python -m poad_jax.study --study=studies/virtualhome_options_seed0.py
"""

import importlib.util
import pathlib

_B = pathlib.Path(__file__).with_name("virtualhome_options.py")
_spec = importlib.util.spec_from_file_location("virtualhome_options", _B)
_options = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_options)

FIRST = ("POAD lambda per action", "POAD trie T=2, corrected", "POAD action scores, corrected",
         "POAD action scores, offered entropy")


def get_study():
    study = _options.get_study()
    variants = study["axes"]["variant"]
    new_poad = [v for label in FIRST for v in variants if v["label"] == label]
    twosome = [v for v in variants if v["method"] == "twosome" and v["label"] != "TWOSOME"]
    defaults = [v for v in variants if v["label"] in ("POAD", "POAD action scores", "TWOSOME")]
    assert len(new_poad + twosome + defaults) == len(variants)
    study["name"] = "virtualhome_options_seed0"
    study["axes"] = {"variant": new_poad + twosome + defaults}
    study["seeds"] = (0,)
    return study
