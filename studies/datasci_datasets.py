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
balance_scale's two cells are stage 1's seed-0 cells of the chosen candidate
and of `no_learning` (the same trainer configs: reused, not re-run).

Reported (no rule decides anything here; it is a table): per dataset, the
best program of each arm re-scored by `python -m poad_jax.best_program`
(mean ROC AUC over the five CAAFE splits), the env step that found it, the
mean reward per env step over the last quarter, the programs that ran, and
the wall time per env step on the machine named; beside them the paper's
Table 4 where the project has its values (POAD-Best with CodeLLaMA-7B and
CAAFE with GPT-4 on balance_scale; the rest were not found offline).

Time: 30-45 minutes a cell on a 2-core CPU with native bfloat16, one at a
time in the background, each cell whole on the machine that starts it (8 new
cells).

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
                # as stage 1's reference ran (λ per token): with the actor at lr 0, λ moves only the
                # critic, never a sampled program; so balance_scale's cell is stage 1's, reused
                {"label": "no_learning", "ppo.actor_lr": 0.0, "ppo.lambda_scope": "token"},
            ],
        },
        "seeds": (0,),
        "report": {"metric": "step_reward_mean", "smoothing": 3, "final_fraction": 0.25,
                   "facet": "dataset",
                   "steps": {"succeeded": "runnable", "reward": "AUC"},
                   "best_programs": {"rescore": True}},
    }
