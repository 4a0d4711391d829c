"""Choosing the actor learning rate for SmolLM2-135M on VirtualHome food preparation.

The paper's rates (actor 1e-6, critic 5e-5) are for LLaMA-2-7B.  SmolLM2's
prior succeeds about as rarely as a uniform choice among the offered actions
(2 % of 50-step episodes), so a short sweep sees no success to rank by.  It
ranks by the size of the policy step instead: for POAD and for TWOSOME
(seed 0, 128 env steps = 4 updates each) it logs PPO's approximate KL per
update at three decades of actor learning rate, and the comparison study
(`studies/virtualhome.py`) uses, for all three methods, the largest rate
whose mean KL stays under half the paper's `target_kl` (0.02) for both.

    python -m poad_jax.study --study=studies/virtualhome_lr.py
"""


def get_study():
    return {
        "name": "virtualhome_lr",
        "base_config": "configs/virtualhome.py",
        "fixed": {"total_env_steps": 128, "rollout_length": 8},
        "axes": {
            "ppo.actor_lr": [1e-5, 1e-4, 1e-3],
            "variant": [
                {"label": "POAD", "method": "poad"},
                {"label": "TWOSOME", "method": "twosome"},
            ],
        },
        "seeds": (0,),
        "report": {"metric": "approx_kl", "facet": "ppo.actor_lr", "final_fraction": 1.0},
    }
