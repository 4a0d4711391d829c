"""Issue 40's options on the synthetic task, second step: each behaviour option on top of lambda per action.

`studies/method_options_synthetic.py` ran each option alone at 16-token
actions, where per-token lambda makes POAD myopic in some seeds; every option
that keeps per-token lambda inherits that, so this study puts each of the
behaviour options on top of `ppo.lambda_scope="action"` (the one that fixed
the myopia there), same task, same settings, 3 seeds.

Plan (written 2026-11-25 after the first study's seed-0 cells, before any cell
of this one ran; nothing here is tuned: the options keep the values fixed in
the first study, exploration temperature 2 and weight clip 1).  Reading: an
option helps when its final return's mean is above "POAD lambda per action"
by more than that group's seed std; it hurts when below by as much.

    python -m poad_jax.study --study=studies/method_options_synthetic_combined.py
"""

PER_ACTION = {"method": "poad", "ppo.lambda_scope": "action"}


def get_study():
    return {
        "name": "method_options_synthetic_combined",
        "base_config": "configs/synthetic.py",
        "fixed": {"env.kwargs.action_length": 16},
        "axes": {
            "variant": [
                {"label": "POAD lambda per action", **PER_ACTION},
                {"label": "+ action scores", **PER_ACTION, "restricted_sampling": "action_scores"},
                {"label": "+ action scores, offered entropy", **PER_ACTION, "restricted_sampling": "action_scores",
                 "ppo.entropy_scope": "offered"},
                {"label": "+ action scores, corrected", **PER_ACTION, "restricted_sampling": "action_scores",
                 "ppo.behaviour_correction": "importance"},
                {"label": "+ trie T=2, corrected", **PER_ACTION, "trie_explore_temperature": 2.0,
                 "ppo.behaviour_correction": "importance"},
            ],
        },
        "seeds": (0, 1, 2),
        "report": {"metric": "episode_return", "smoothing": 5, "threshold": 3.5,
                   "theory": "poad_jax.tools.theory:save_or_take_optimum"},
    }
