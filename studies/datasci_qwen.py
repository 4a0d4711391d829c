"""POAD vs NTPO on DataSciCoding (balance_scale) with Qwen2.5-Coder-0.5B-Instruct (paper §6.2).

The preset configs/datasci_qwen.py (256 new tokens, bfloat16 matmuls, 4
threads x 4 steps per update) for 192 env steps (12 updates), one seed per
method: about 4 minutes per update on a quiet 2-core machine, 1.5 hours
for both cells (measured 2026-11-24).  Actor lr 1e-4 as chosen for SmolLM2
on VirtualHome (`studies/virtualhome_lr.py`): a Qwen sweep is out of reach
here.  NTPO: gamma_w = gamma = 0.95.  The
per-update metrics hold the runnable count (`steps_succeeded`), the mean step
reward (AUC when the program ran, -1 when it failed) and the best program's
AUC so far (`best_step_reward`); the report tabulates per cell the fraction of
programs that ran, their mean AUC and the best AUC.  Each cell keeps its best program
(`python -m poad_jax.best_program --workdir <cell>`).

    python -m poad_jax.study --study=studies/datasci_qwen.py
"""


def get_study():
    return {
        "name": "datasci_qwen",
        "base_config": "configs/datasci_qwen.py",
        "fixed": {"total_env_steps": 192, "ppo.actor_lr": 1e-4},
        "axes": {
            "variant": [
                {"label": "POAD", "method": "poad"},
                {"label": "NTPO", "method": "ntpo"},
            ],
        },
        "seeds": (0,),
        "report": {"metric": "step_reward_mean", "smoothing": 3, "final_fraction": 0.25,
                   "steps": {"succeeded": "runnable", "reward": "AUC"}},
    }
