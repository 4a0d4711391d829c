"""gamma_w = gamma_a < 1 for both POAD and TWOSOME (paper Fig. 5 right).

POAD with gamma_w = gamma_a is NTPO; TWOSOME with gamma_w = gamma_a discounts
each action by gamma_a * gamma_w**(n - 1), as if its tokens were time steps
(`methods.py`).  8-token actions on `synthetic/save_or_take`.

    python -m poad_jax.study --study=studies/discount_match.py
"""



def get_study():
    study = {}
    study["name"] = "discount_match"
    study["base_config"] = "configs/synthetic.py"
    study["fixed"] = {"env.kwargs.action_length": 8}
    study["axes"] = {
        "variant": [
            {"label": "POAD", "method": "poad"},
            {"label": "POAD gw=ga=0.95 (NTPO)", "method": "ntpo", "gamma_w": 0.95},
            {"label": "TWOSOME", "method": "twosome"},
            {"label": "TWOSOME gw=ga=0.95", "method": "twosome", "gamma_w": 0.95},
        ],
    }
    study["seeds"] = (0, 1, 2, 3, 4)
    study["report"] = {"metric": "episode_return", "smoothing": 5, "threshold": 3.5,
                    "theory": "poad_jax.tools.theory:save_or_take_optimum"}
    return study
