"""DataSciCoding: does POAD's early fall away from runnable programs come from how the update is used? (issue 44)

Why: in the comparison's POAD seed-0 cell (`studies/datasci_poad_ntpo.py`,
actor lr 1e-3) the programs that ran fell 8, 4, 1, 0, 0, 1, 1, 1 of 8 in
the first 8 updates, NTPO's at the same settings 8, 4, 5, 2, 3, 4, 5, 4;
later both policies collapsed again after batches where nearly every
program ran (docs/results/datasci_poad_ntpo.md, "How seed 0's policies moved: through
collapses"). Two readings from the raw logs, neither tested:
  1. per-minibatch advantage normalisation: a minibatch is 4 rows here, and
     when their rewards are nearly equal (every program ran, AUCs close),
     dividing by their spread turns critic noise into unit-size advantages;
  2. lambda per token: with 256-token actions and an uninformative critic, a
     failing program's -1 reaches the tokens far from its error (the import,
     the estimator's name) about as much as the error itself; with
     `ppo.lambda_scope="action"` POAD's first-token advantage is
     action-level GAE and lambda applies only where gamma does.
This session-sized study changes one of them at a time on the same cell:
POAD, seed 0, actor lr 1e-3, `configs/datasci.py`, 64 env steps (8
updates of 8 programs). The same seed gives every variant the same first
batch, sampled before any update (a check that this machine reproduces the
comparison's cell: update 1's programs should be the same).

A control cell (POAD's defaults: normalisation on, lambda per token) runs
beside them on the same machine. (Amended 2026-11-27, 17 minutes into the
first cell, having seen only its first update, which precedes any learning:
on this session's CPU, an AMD EPYC with AVX-512 BF16, `matmul_dtype="auto"`
resolves to bfloat16, where the comparison's cells ran float32 on an AVX2
CPU, so those cells are no same-numerics control.)

What is reported (fixed before any cell ran, 2026-11-27): programs that ran
in updates 2-8 (56 programs, sampled after at least one update) beside the
control's and the comparison cells' (POAD 8 of 56, NTPO 27 of 56), with the
per-update approximate KL beside them (without normalisation the advantages
are on the rewards' scale, so a smaller step is a second explanation).
Reading, one seed, an indication and not a test: 20 or more of 56 "kept
runnable programs as NTPO did", 12 or fewer "fell as POAD did", in between
"unclear". A variant that keeps them becomes a candidate setting for both
methods in a later comparison; nothing here changes the comparison's
settings by itself.

A fourth cell, written after the first three had run (2026-11-27, before
it ran): both variants kept programs running where the control fell (8, 4,
1, 1, 0, 0 in its first six updates, as the comparison's cell did), but both
also took smaller steps (update 2's approximate KL 0.0135 and 0.0083 against
the control's 0.048). So the control runs again at actor lr 3e-4, the
sweep's next rate, whose steps should be about as small as the variants'.
Same reading of programs that ran in updates 2-8: 20 or more of 56, "a
smaller step alone avoids the fall, and the variants cannot be told from
their smaller steps"; 12 or fewer, "a smaller step alone does not: what the
variants change matters"; in between, "unclear". Its median approximate KL
is reported beside the variants'.

About 15-50 s per env step on a quiet 2-core CPU: 20-50 minutes a cell,
each cell whole within one session (checkpoints stay on the machine);
re-running the command resumes it.

    python -m poad_jax.study --study=studies/datasci_collapse.py
    python -m poad_jax.study --study=studies/datasci_collapse.py --report
"""


def get_study():
    return {
        "name": "datasci_collapse",
        "base_config": "configs/datasci.py",
        # λ per token pinned: configs/datasci.py's default when this ran (it moved to "action" after stage 1 of
        # studies/datasci_settings.py); the cells' configs are as they ran
        "fixed": {"total_env_steps": 64, "ppo.actor_lr": 1e-3, "method": "poad", "ppo.lambda_scope": "token"},
        "axes": {
            "variant": [  # in the order written: the control after the first cell had started
                {"label": "no_advantage_normalisation", "ppo.normalize_advantages": False},
                {"label": "lambda_per_action", "ppo.lambda_scope": "action"},
                {"label": "control", "ppo.normalize_advantages": True, "ppo.lambda_scope": "token"},
                {"label": "control_lr_3e-4", "ppo.normalize_advantages": True, "ppo.lambda_scope": "token",
                 "ppo.actor_lr": 3e-4},
            ],
        },
        "seeds": (0,),
        "report": {"metric": "step_reward_mean", "smoothing": 1, "final_fraction": 0.25,
                   "steps": {"succeeded": "runnable", "reward": "AUC"}},
    }
