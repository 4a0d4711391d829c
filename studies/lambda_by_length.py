"""Why long actions hurt POAD here: GAE's lambda is applied per token.

Token-level GAE (`gae.token_gae`, as in the authors' code) multiplies by
lambda at every token, so one n-token action carries lambda**n of the
advantage from what follows, and the rest comes from the critic's estimate.
TWOSOME's action-level GAE multiplies by lambda once per action.  This study
compares lambda = 0.95 (the paper's) with lambda = 1 (Monte-Carlo advantages:
no reliance on the critic) for 8- and 16-token actions.

    python -m poad_jax.study --study=studies/lambda_by_length.py
"""


def get_study():
    return {
        "name": "lambda_by_length",
        "base_config": "configs/synthetic.py",
        "fixed": {},
        "axes": {
            "env.kwargs.action_length": [8, 16],
            "ppo.lam": [0.95, 1.0],
            "variant": [
                {"label": "POAD", "method": "poad"},
                {"label": "NTPO gw=0.95", "method": "ntpo", "gamma_w": 0.95},
                {"label": "TWOSOME", "method": "twosome"},
            ],
        },
        "seeds": (0, 1, 2, 3, 4),
        "report": {"metric": "episode_return", "smoothing": 5, "threshold": 3.5,
                   "facet": "env.kwargs.action_length", "theory": "poad_jax.tools.theory:save_or_take_optimum"},
    }
