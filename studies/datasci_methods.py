"""DataSciCoding, stage 2: POAD against NTPO and GRPO at stage 1's settings, 192 env steps.

Why: stage 1 (`studies/datasci_settings.py`, docs/results/datasci_settings.md)
chose the settings at which POAD's programs improve over sampling from the
untrained model within 192 env steps; `configs/datasci.py` holds them. Does
POAD's token-level credit (BAD) do better there than the naive token-level
backup (NTPO) and than a critic-free group method (GRPO)?

Settings (written 2026-11-28, after stage 1's eight cells and before any cell
of this study ran; no setting changes after a cell has run):
`configs/datasci.py` as stage 1 left it (Qwen2.5-Coder-0.5B-Instruct,
balance_scale, 8 threads x 1 step per update, 256 new tokens, temperature
0.5, top-k 50, actor lr 1e-3 and λ per action (`ppo.lambda_scope="action"`),
critic lr 5e-5, target KL 0.02, one epoch of 2 minibatches, entropy
coefficient 0.01), 192 env steps (24 updates of 8 programs), seeds 0-4
(stage 1's cells took 32-41 minutes on a quiet 2-core CPU with native
bfloat16: under an hour, so five seeds). Three arms:
  - POAD (`method=poad`); its seeds 0 and 1 are stage 1's cells of the chosen
    candidate (the same trainer config: the study runner reuses them from the
    sibling workdir; published raw logs:
    docs/results/raw/cpu_2026-11-28_datasci_settings/).
  - NTPO (`method=ntpo`): the same settings; λ per action applies to it as to
    POAD (an action's last token is where γ applies in both backups).
  - GRPO (`method=grpo`): the same actor settings (lr, entropy, target KL,
    minibatches) and no critic, no KL penalty to the base model (the
    default); the 8 threads of an update share the task's prompt and form one
    group (`group.size=0`), and each program's advantage is its reward
    normalised by the group's mean and std. A group method's episodes are
    cut at `rollout_length` (1): every GRPO program is a first attempt,
    where POAD's and NTPO's threads carry on after a failing program with a
    retry prompt that quotes its error (up to 5 attempts). That is the method
    as users run it, and the report counts per env step, so the arms compare
    alike.
The page sets stage 1's `no_learning` cells (actor lr 0, seeds 0 and 1:
0.118 on the primary measure) beside the arms as the untrained model's
line; they are not cells of this study.

The rule (written before any cell ran):
  1. Primary measure, as stage 1: the mean reward per env step over env
     steps 145-192 (a program that runs earns its mean ROC AUC over five
     splits, one that fails -1), per seed; reported as mean +- sample std
     over the five seeds, with every seed's value.
  2. One arm leads another when its mean exceeds the other's by more than
     the larger of the two seed stds and Welch's t-test on the five
     per-seed values gives p < 0.05; otherwise the evidence does not order
     them, and the page says so.
  3. Beside it, not deciding: programs that ran over the same env steps,
     pooled over seeds, with Wilson 95 % intervals; their mean AUC; the
     best program per cell (re-scored); curves per env step with seed
     bands; approximate KL and entropy per update.
Seeds 0-1 of POAD are the seeds stage 1 chose on: the report also gives the
fresh seeds 2-4 apart.

Time: 30-45 minutes a cell on a 2-core CPU with native bfloat16, one at a
time in the background, each cell whole on the machine that starts it (13
new cells; a cell lost with its machine runs again whole, from its seed).

    python -m poad_jax.study --study=studies/datasci_methods.py
    python -m poad_jax.study --study=studies/datasci_methods.py --report --publish=docs/results
"""


def get_study():
    return {
        "name": "datasci_methods",
        "base_config": "configs/datasci.py",
        "fixed": {"total_env_steps": 192},
        "axes": {
            "variant": [
                {"label": "POAD", "method": "poad"},
                {"label": "NTPO", "method": "ntpo"},
                {"label": "GRPO", "method": "grpo"},
            ],
        },
        "seeds": (0, 1, 2, 3, 4),
        "report": {"metric": "step_reward_mean", "smoothing": 3, "final_fraction": 0.25,
                   "steps": {"succeeded": "runnable", "reward": "AUC"},
                   "pairs": [("POAD", "NTPO"), ("POAD", "GRPO"), ("NTPO", "GRPO")],
                   "best_programs": {"rescore": True, "reference": {
                       "POAD-Best, CodeLLaMA-7B (paper, Table 4)": 0.9651,
                       "CAAFE with GPT-4 (paper, Table 4)": 0.882}}},
    }
