"""Action length (paper §4.2, insight ii): n in {2, 4, 8, 16} tokens, POAD vs NTPO vs TWOSOME.

NTPO uses gamma_w = gamma_a = 0.95 (its default).  On `synthetic/save_or_take`.

    python -m poad_jax.study --study=studies/action_length.py
"""



def get_study():
    study = {}
    study["name"] = "action_length"
    study["base_config"] = "configs/synthetic.py"
    study["fixed"] = {}
    study["axes"] = {
        "env.kwargs.action_length": [2, 4, 8, 16],
        "variant": [
            {"label": "POAD", "method": "poad"},
            {"label": "NTPO gw=0.95", "method": "ntpo", "gamma_w": 0.95},
            {"label": "TWOSOME", "method": "twosome"},
        ],
    }
    study["seeds"] = (0, 1, 2, 3, 4)
    study["report"] = {"metric": "episode_return", "smoothing": 5, "threshold": 3.5,
                    "facet": "env.kwargs.action_length", "theory": "poad_jax.tools.theory:save_or_take_optimum"}
    return study
