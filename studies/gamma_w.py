"""The paper's gamma_w ablation (Fig. 5 left): NTPO with gamma_w in {0.99, 0.95, 0.9, 0.8} against POAD.

On `synthetic/save_or_take` with 8-token actions (configs/synthetic.py).

    python -m poad_jax.study --study=studies/gamma_w.py
"""



def get_study():
    study = {}
    study["name"] = "gamma_w"
    study["base_config"] = "configs/synthetic.py"
    study["fixed"] = {"env.kwargs.action_length": 8}
    study["axes"] = {
        "variant": [
            {"label": "POAD", "method": "poad"},
            {"label": "NTPO gw=0.99", "method": "ntpo", "gamma_w": 0.99},
            {"label": "NTPO gw=0.95", "method": "ntpo", "gamma_w": 0.95},
            {"label": "NTPO gw=0.9", "method": "ntpo", "gamma_w": 0.9},
            {"label": "NTPO gw=0.8", "method": "ntpo", "gamma_w": 0.8},
        ],
    }
    study["seeds"] = (0, 1, 2, 3, 4)
    study["report"] = {"metric": "episode_return", "smoothing": 5, "threshold": 3.5,
                    "theory": "poad_jax.tools.theory:save_or_take_optimum"}
    return study
