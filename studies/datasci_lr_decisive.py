"""`studies/datasci_lr.py`'s cells in the order that decides its rule soonest (issue 44).

The sweep's first cell (actor lr 3e-3, POAD, seed 0) ended with a median
per-update approximate KL above the rule's 0.02 (0.118, 0.359, 0.043 ... over
its 8 updates), so 3e-3 cannot qualify whatever its NTPO cell does. The rule
takes the largest qualifying rate, so the next rate down, 1e-3, decides next:
if both its cells qualify, no result of 3e-4, 1e-4 or 3e-3 NTPO can change the
choice. This file runs the same cells (same settings, same names) with 1e-3
first, then 3e-4, 1e-4 and 3e-3 (its POAD cell reused from `datasci_lr`); the
sweep reuses every finished cell of this one, so nothing runs twice. The rule
and its threshold are the sweep's, unchanged (its docstring).

    python -m poad_jax.study --study=studies/datasci_lr_decisive.py
"""

import importlib.util
import pathlib

_SWEEP = pathlib.Path(__file__).with_name("datasci_lr.py")
_spec = importlib.util.spec_from_file_location("datasci_lr", _SWEEP)
_sweep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_sweep)

ORDER = (1e-3, 3e-4, 1e-4, 3e-3)


def get_study():
    study = _sweep.get_study()
    assert sorted(study["axes"]["ppo.actor_lr"]) == sorted(ORDER)
    study["name"] = "datasci_lr_decisive"
    study["axes"] = {"ppo.actor_lr": list(ORDER), "variant": study["axes"]["variant"]}
    return study
