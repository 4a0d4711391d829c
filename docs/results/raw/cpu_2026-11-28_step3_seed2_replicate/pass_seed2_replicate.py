"""Study A step 3's seed 2, TWOSOME 3 and POAD 4 alone, on a CPU: a replicate of the lent H200's cells of record.

Same name, base config and cell settings as studies/virtualhome_preset_step3.py, so the cells are the
study's; run in a workdir of its own (runs/studies/step3_seed2_cpu_replicate) and reported beside the
record, not pooled with it (the study file's note of 2026-11-28 says why).
"""
import importlib.util

_spec = importlib.util.spec_from_file_location("_parent_study", "studies/virtualhome_preset_step3.py")
_parent = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_parent)

KEPT = ("TWOSOME 3 1x4", "POAD 4 entropy 0.01")  # in this order: one cell at a time


def get_study():
    study = _parent.get_study()
    variants = {variant["label"]: variant for variant in study["axes"]["variant"]}
    study["axes"]["variant"] = [variants[label] for label in KEPT]
    study["seeds"] = (2,)
    return study
