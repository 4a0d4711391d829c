"""Issue 40's method options on the synthetic task first: does each do what it should?

The synthetic save-or-take task (configs/synthetic.py, tiny random model: no
language prior) at 16-token actions, where per-token lambda made some POAD
seeds myopic (studies/lambda_by_length.py).  Each option of the study-B list
beside plain POAD, TWOSOME and NTPO, all at the synthetic config's settings:

- lambda where gamma applies (`ppo.lambda_scope="action"`), POAD and NTPO;
- the paper code's sampling (`restricted_sampling="action_scores"`), alone, with
  the entropy over the offered continuations (`ppo.entropy_scope="offered"`),
  and with the importance correction (`ppo.behaviour_correction="importance"`);
- trie sampling with exploration at temperature 2, corrected
  (`trie_explore_temperature=2`).

Plan (written before any cell ran, 2026-11-25): 3 seeds each, the synthetic
config's 4,800 env steps.  What it checks, not what it tunes: an option "does
what it should" when its runs train without error, log the quantity it acts
on (per-token lambdas: the final return against POAD's at per-token lambda;
the entropies over both supports; the behaviour KL and the mean importance
weight), and do not end below plain POAD's final return by more than the
seed bands (mean - std).  No setting is changed after seeing the results.

    python -m poad_jax.study --study=studies/method_options_synthetic.py
"""


def get_study():
    return {
        "name": "method_options_synthetic",
        "base_config": "configs/synthetic.py",
        "fixed": {"env.kwargs.action_length": 16},
        "axes": {
            "variant": [
                {"label": "POAD", "method": "poad"},
                {"label": "POAD lambda per action", "method": "poad", "ppo.lambda_scope": "action"},
                {"label": "POAD action scores", "method": "poad", "restricted_sampling": "action_scores"},
                {"label": "POAD action scores, offered entropy", "method": "poad",
                 "restricted_sampling": "action_scores", "ppo.entropy_scope": "offered"},
                {"label": "POAD action scores, corrected", "method": "poad", "restricted_sampling": "action_scores",
                 "ppo.behaviour_correction": "importance"},
                {"label": "POAD trie T=2, corrected", "method": "poad", "trie_explore_temperature": 2.0,
                 "ppo.behaviour_correction": "importance"},
                {"label": "NTPO gw=0.95 lambda per action", "method": "ntpo", "gamma_w": 0.95,
                 "ppo.lambda_scope": "action"},
                {"label": "TWOSOME", "method": "twosome"},
            ],
        },
        "seeds": (0, 1, 2),
        "report": {"metric": "episode_return", "smoothing": 5, "threshold": 3.5,
                   "theory": "poad_jax.tools.theory:save_or_take_optimum"},
    }
