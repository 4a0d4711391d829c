"""The actor learning rate for the DataSciCoding comparison of POAD and NTPO (issue 44), chosen before it runs.

Why: at actor lr 1e-4 (`studies/datasci_qwen.py`) the approximate KL between
consecutive policies stayed at 2e-5 to 1.1e-4 per token for 12 updates and
the clip fraction below 0.001 (docs/results/datasci_qwen.md): the policy
never moved, so that study could not separate the methods. The authors' rate
for this task, 1e-6 (chosen for CodeLLaMA-7B), moves it less still. Here
rewards exist from the first env step (about 3 in 4 of the untrained
model's programs run), so the rate can be chosen from the first updates.

The sweep: the default job's settings (`configs/datasci.py`: Qwen2.5-Coder-0.5B-Instruct,
8 threads x 1 step per update, 256 new tokens, balance_scale), actor lr 3e-3,
1e-3, 3e-4 and 1e-4 (the KL of a small step grows about as the square of the
rate: 1e-3 should give about 100 times the KL seen at 1e-4), POAD and NTPO
(γw = γ = 0.95), seed 0, the first 64 env steps (8 updates), highest rate
first. Every other setting stays the config's (critic lr 5e-5, target KL
0.02, one epoch of 2 minibatches).

The rule, written down before any of these cells ran (2026-11-26), is the
one `scripts/paper_lr_rule.py` applies (tests/test_paper_lr_rule.py):
  1. A rate qualifies if (a) a program ran within the 64 env steps in at
     least one of its two cells, and (b) in both cells the median per-update
     approximate KL (`approx_kl`, measured before the KL skip) is at most
     0.02, the threshold at which the update skips a minibatch.
  2. The comparison (POAD and NTPO, 3 seeds each) uses the largest
     qualifying rate, the same for both methods.
  3. If no rate qualifies for want of a runnable program, the sweep runs on
     to 128 env steps before choosing; if only for KL, 3e-5 is added.
Its cells are the first env steps of the comparison's seed-0 cells at the
chosen rate (same config and seed). About 25 s per env step on a quiet
2-core AVX2 CPU (docs/performance.md): 27 minutes per cell, 3.6 hours for
the sweep, one cell at a time in the background; re-running the command
resumes it, and each cell fits in one session. (The GPU machine is no help
here yet: the Qwen GGUF, 469 MB in six wheel parts, would take eight
64 MiB calls to carry, and the sandbox needs bubblewrap there.)

    python -m poad_jax.study --study=studies/datasci_lr.py
    python scripts/paper_lr_rule.py --workdir=runs/studies/datasci_lr --env-steps=64
"""


def get_study():
    return {
        "name": "datasci_lr",
        # The 1e-3 cells ran as a pass of their own name (now `--cells=actor_lr=0.001`).
        "former_names": ("datasci_lr_decisive",),
        "base_config": "configs/datasci.py",
        # λ per token pinned: configs/datasci.py's default when this ran (it moved after studies/datasci_settings.py)
        "fixed": {"total_env_steps": 64, "ppo.lambda_scope": "token"},
        "axes": {
            "ppo.actor_lr": [3e-3, 1e-3, 3e-4, 1e-4],
            "variant": [
                {"label": "POAD", "method": "poad"},
                {"label": "NTPO", "method": "ntpo"},
            ],
        },
        "seeds": (0,),
        "report": {"metric": "step_reward_mean", "facet": "ppo.actor_lr", "smoothing": 3, "final_fraction": 0.25,
                   "steps": {"succeeded": "runnable", "reward": "AUC"}},
    }
