"""Choosing the actor learning rate for SmolLM2-135M on VirtualHome food preparation.

The paper's rates (actor 1e-6, critic 5e-5) are for LLaMA-2-7B.  This sweep
tries three decades of actor learning rate for POAD and for TWOSOME (seed 0,
1,024 env steps each) and the comparison study (`studies/virtualhome.py`)
uses the one with the best mean over both methods for all three methods.
Cells equal to the comparison's are reused, not trained twice.

    python -m poad_jax.study --study=studies/virtualhome_lr.py
"""


def get_study():
    return {
        "name": "virtualhome_lr",
        "base_config": "configs/virtualhome.py",
        "fixed": {"total_env_steps": 1024, "rollout_length": 8},
        "axes": {
            "ppo.actor_lr": [1e-5, 1e-4, 1e-3],
            "variant": [
                {"label": "POAD", "method": "poad"},
                {"label": "TWOSOME", "method": "twosome"},
            ],
        },
        "seeds": (0,),
        "report": {"metric": "episode_return", "smoothing": 5, "facet": "ppo.actor_lr", "final_fraction": 0.25},
    }
