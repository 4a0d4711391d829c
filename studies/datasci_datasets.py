"""DataSciCoding, stage 3: the best program per dataset, POAD against sampling without learning.

Why: the paper's Table 4 reports, per dataset, the best program POAD found
(POAD-Best, CodeLLaMA-7B, 10k env steps on a GPU) beside CAAFE. Here the
question is narrower and answerable on a CPU: within 192 env steps, does
learning (POAD at stage 1's settings) find better programs than the same
number of programs sampled from the untrained model?

Settings (written 2026-11-28, after stage 1's eight cells and before any cell
of this study ran; no setting changes after a cell has run):
`configs/datasci.py` as stage 1 left it (Qwen2.5-Coder-0.5B-Instruct, 8
threads x 1 step per update, 256 new tokens, temperature 0.5, top-k 50,
actor lr 1e-3, λ per action), 192 env steps, seed 0, on every dataset the project loads
offline: balance_scale (built from its definition), breast_w (the OpenML
ARFF), pharyngitis, health_insurance and spaceship_titanic (the Kaggle CSVs
in ../shared/datasets; `POAD_DATA_DIR` points there). airlines is left out:
it has no offline copy (its loader needs the network). Two arms per dataset:
  - POAD (`method=poad`);
  - no_learning: the same run at actor lr 0, the untrained model sampling
    as many programs with the same sampler (stage 1's reference).
balance_scale's POAD cell is stage 1's seed-0 cell of the chosen candidate
(the same trainer config: reused, not re-run).

Amended 2026-11-29, before any cell of this study ran (none had; only the
reuse of stage 1's two balance_scale cells was planned): the no_learning
arm also sets `learn=False`, which skips the behaviour pass and the learner
and changes nothing the sampler sees (at actor lr 0 the actor never moves;
the critic it still trained never touches a program). The reason is cost
alone: such a cell takes only the sampler's and the sandbox's time, which in
stage 1's two no_learning cells was 1,076 and 602 s of the 3,938 and 2,405 s
their updates took. The price: balance_scale's no_learning cell is
no longer stage 1's (its config differs in `learn`) and runs anew; its
programs set beside stage 1's `no_learning__seed=0` show whether the two
arms sample the same (the trainer's test checks it on the toy task).

Reported (no rule decides anything here; it is a table): per dataset, the
best program of each arm re-scored by `python -m poad_jax.best_program`
(mean ROC AUC over the five CAAFE splits), the env step that found it, the
mean reward per env step over the last quarter, the programs that ran, and
the wall time per env step on the machine named; beside them the paper's
Table 4 where the project has its values (POAD-Best with CodeLLaMA-7B and
CAAFE with GPT-4 on balance_scale; the rest were not found offline).

Time: 30-70 minutes a POAD cell on a 2-core CPU with native bfloat16, a
quarter to a third of that a no_learning cell, one at a time in the background, each cell
whole on the machine that starts it (9 new cells).

    POAD_DATA_DIR=../shared/datasets python -m poad_jax.study --study=studies/datasci_datasets.py
    python -m poad_jax.study --study=studies/datasci_datasets.py --report --publish=docs/results
"""

DATASETS = ("balance_scale", "breast_w", "pharyngitis", "health_insurance", "spaceship_titanic")


def get_study():
    return {
        "name": "datasci_datasets",
        "base_config": "configs/datasci.py",
        "fixed": {"total_env_steps": 192, "method": "poad"},
        "axes": {
            "dataset": [{"label": name, "env.name": f"datasci/{name}"} for name in DATASETS],
            "variant": [
                {"label": "POAD"},
                # as stage 1's reference ran (actor lr 0, λ per token), and with no learner at all
                # (learn=False, the amendment above): the same programs in a quarter to a third of the time
                {"label": "no_learning", "ppo.actor_lr": 0.0, "ppo.lambda_scope": "token", "learn": False},
            ],
        },
        "seeds": (0,),
        "report": {"metric": "step_reward_mean", "smoothing": 3, "final_fraction": 0.25,
                   "facet": "dataset",
                   "steps": {"succeeded": "runnable", "reward": "AUC"},
                   "best_programs": {"rescore": True}},
    }
