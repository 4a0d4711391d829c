"""POAD, NTPO and TWOSOME on VirtualHome food preparation with SmolLM2-135M (paper §6.1, Fig. 3).

Three seeds per method, 1,024 env steps each (4 threads x 8 steps per
update), the paper's PPO settings except the actor learning rate, which
`studies/virtualhome_lr.py` chose for this 135M model (the same for every
method).  NTPO uses gamma_w = gamma = 0.95, as in the paper.

    python -m poad_jax.study --study=studies/virtualhome.py
"""

ACTOR_LR = 1e-4  # from studies/virtualhome_lr.py (docs/results.md)


def get_study():
    return {
        "name": "virtualhome",
        "base_config": "configs/virtualhome.py",
        "fixed": {"total_env_steps": 1024, "rollout_length": 8, "ppo.actor_lr": ACTOR_LR},
        "axes": {
            "variant": [
                {"label": "POAD", "method": "poad"},
                {"label": "NTPO", "method": "ntpo"},
                {"label": "TWOSOME", "method": "twosome"},
            ],
        },
        "seeds": (0, 1, 2),
        "report": {"metric": "episode_return", "smoothing": 5, "final_fraction": 0.25},
    }
