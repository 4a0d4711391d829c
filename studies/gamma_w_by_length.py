"""Beyond the paper: NTPO's gap to POAD over gamma_w x action length, against the closed form.

The paper shows NTPO's gap growing as gamma_w falls (Fig. 5) and argues it
grows with action length (§4.2); this grid measures the whole surface on
`synthetic/save_or_take` and draws the theory's prediction (the return of
the policy optimal under each method's per-action discount) beside it.

    python -m poad_jax.study --study=studies/gamma_w_by_length.py --workers=2
"""



def get_study():
    study = {}
    study["name"] = "gamma_w_by_length"
    study["base_config"] = "configs/synthetic.py"
    study["fixed"] = {}
    study["axes"] = {
        "variant": [
            {"label": "POAD", "method": "poad"},
            {"label": "NTPO gw=0.99", "method": "ntpo", "gamma_w": 0.99},
            {"label": "NTPO gw=0.95", "method": "ntpo", "gamma_w": 0.95},
            {"label": "NTPO gw=0.9", "method": "ntpo", "gamma_w": 0.9},
            {"label": "NTPO gw=0.8", "method": "ntpo", "gamma_w": 0.8},
        ],
        "env.kwargs.action_length": [2, 4, 8, 16],
    }
    study["seeds"] = (0, 1, 2, 3, 4)
    study["report"] = {
        "metric": "episode_return", "smoothing": 5, "threshold": 3.5,
        "facet": "env.kwargs.action_length", "heatmap": ("variant", "env.kwargs.action_length"),
        "theory": "poad_jax.tools.theory:save_or_take_optimum",
    }
    return study
