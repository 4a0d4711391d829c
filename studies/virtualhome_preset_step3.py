"""Study A, step 3: three seeds where the ladder showed an effect, and TWOSOME's preset with its advantages intact.

Written 2026-11-27 (sixteenth session), after step 1
(`studies/virtualhome_preset_8steps.py`) and the ladder's seed 0
(`studies/virtualhome_preset_ladder.py`, every rung but POAD's rung 2, which
was still running) and before any cell of this file ran.

What came before (docs/results.md, "Study A"): at 4 threads x 8 steps per
update, TWOSOME's preset (4 minibatches of 8 rows, 8 loss chunks, the
authors' per-chunk advantage normalisation) normalises one row per chunk,
which makes every advantage 0, so step 1's TWOSOME cell and the ladder's
TWOSOME rung 2 had no policy gradient.  On the ladder's seed 0 the first
rungs whose last-quarter successes clear the rule (Wilson 95 % lower end
above 1.7 %) were TWOSOME's rung 3 (one loss chunk: the advantages intact)
and POAD's rung 4 (the entropy bonus 0.01).

Cells (seeds 0, 1, 2; the runner reuses the ladder's finished seed-0 cells,
whose configs these equal):
- The ladder's rule: the first rung that learned and the one before it, on
  seeds 1 and 2: POAD rungs 3 and 4, TWOSOME rung 3.  TWOSOME's rung 2 is
  replaced by the next two cells (its seeds would have no policy gradient).
  If POAD's rung 2 (running) passes the rule, its rung 2 and step 1's POAD
  take the place of rungs 3 and 4 here before any POAD seed 1 runs, and this
  docstring says so.
- TWOSOME's preset with two loss chunks (four rows per chunk, as the authors'
  4 x 32 steps give eight chunks), at the preset's actor lr 1e-6 (step 1
  with its advantages intact) and at 1e-4 (rung 2 with its advantages intact).

Order and rule: seed-major (`--seeds=0` first: the two new cells; the
rest is reused).  Each group is read by step 1's rule on the report's table
"Successful episodes in the last 25% of env steps", pooled over its seeds.
If neither new TWOSOME cell passes on seed 0, their seeds 1-2 are cut (the
budget rule of step 1).  The ladder's rungs are read on their three seeds:
an effect that holds pools above 1.7 %.

Added 2026-11-27, before any POAD cell of this file ran: POAD's rung 2 finished
without passing (0 of 32 in the last quarter), so POAD's rungs 3 and 4 stand.

Added 2026-11-27, after the seed-0 pass: TWOSOME "2 lr 1e-4 2 chunks" passes on seed 0 (139 of 139 in
the last quarter; "1 preset 2 chunks" 0 of 32), so the seeds 1-2 of both new cells run.

Added 2026-11-28, before any seed-2 cell finished: seed 2 runs on a lent H200, its five cells at once
(`scripts/gpu_paper_studies.sh`, as the ladder's seed 0 did); those cells are seed 2's of record.  The CPU
pass of seed 2 that had started (TWOSOME 1) goes on as a cross-device replicate, reported beside, not pooled.

Changed 2026-11-28, after seed 2's H200 cells finished (no cell learned; TWOSOME 1 won 2 episodes by chance):
the CPU replicate stopped TWOSOME 1 at update 34 (at lr 1e-6 its policy hardly moves, so a replicate of it
says little about rounding) and runs seed 2's TWOSOME 3 and POAD 4 instead, the two cells whose seed 2 the
reading turns on (`docs/results/raw/cpu_2026-11-28_step3_seed2_replicate/pass_seed2_replicate.py`); still
reported beside the record, not pooled.

    python -m poad_jax.study --study=studies/virtualhome_preset_step3.py --seeds=0
    python -m poad_jax.study --study=studies/virtualhome_preset_step3.py --seeds=1,2
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location(
    "virtualhome_preset_ladder", pathlib.Path(__file__).with_name("virtualhome_preset_ladder.py"))
ladder = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ladder)

TWO_CHUNKS = {"ppo.loss_chunks": 2}  # 8 rows per minibatch at 4 x 8: four rows per chunk, as the authors' 4 x 32


def get_study():
    return {
        "name": "virtualhome_preset_step3",
        "base_config": "configs/virtualhome_paper.py",
        "fixed": {"total_env_steps": 6000, "rollout_length": 8},
        "axes": {
            "variant": [
                ladder.rung("1 preset 2 chunks", "twosome", TWO_CHUNKS),
                ladder.rung("2 lr 1e-4 2 chunks", "twosome", {**ladder.LR, **TWO_CHUNKS}),
                ladder.rung("3 1x4", "twosome", ladder.ONE_EPOCH),
                ladder.rung("3 1x4", "poad", ladder.ONE_EPOCH),
                ladder.rung("4 entropy 0.01", "poad", ladder.ENTROPY),
            ],
        },
        "seeds": (0, 1, 2),
        "report": {"metric": "discounted_return", "smoothing": 10, "final_fraction": 0.25},
    }
