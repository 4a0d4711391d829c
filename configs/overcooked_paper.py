"""Overcooked tomato salad at the authors' own settings (ADRL), one method per preset.

    python -m poad_jax.train --config=configs/overcooked_paper.py:poad   # or :ntpo, :twosome

As configs/virtualhome_paper.py (which explains the preset argument and the
authors' semantics; docs/adrl_parity.md).  Sources (github morning9393/ADRL
at 5ec1aa5, `mappo/`):

| setting | value | source |
|---|---|---|
| task | tomato salad | `Overcooked-LLMA-v4` in `scripts/train_llm.sh:6`, task 0 (`envs/overcooked/overcooked_env.py`) |
| threads x steps per update | 4 x 32 | `scripts/train_overcooked.py:49-50` |
| actor lr, critic lr | 5e-7, 1e-5 | `scripts/train_overcooked.py:52-53`; the paper's Overcooked table (the paper's tables, docs/adrl_parity.md) |
| gamma | 0.99 | `scripts/train_llm.sh:6` |
| total env steps | 40,000 | `scripts/train_llm.sh:6` |
| POAD: epochs x minibatches, entropy, loss chunks | 5 x 2, 1e-4, 1 | `scripts/train_llm.sh:6` |
| NTPO, TWOSOME | 1 x 4, 0.01, 1 | no Overcooked script: `config.py` defaults and `scripts/train_overcooked.py:22` |
| everything else | as configs/virtualhome_paper.py | `config.py` defaults, the agent, critic and trainers |

The paper's run is 40,000 env steps per cell: about ten times a VirtualHome
cell, too long for a 2-core CPU.
"""

import pathlib

from poad_jax.run import config as poad_config

# Per-method PPO settings of the authors' scripts (sources in the table above).
PAPER_METHODS = {
    "poad": dict(epochs=5, num_minibatches=2, ent_coef=1e-4, loss_chunks=1),
    "ntpo": dict(epochs=1, num_minibatches=4, ent_coef=0.01, loss_chunks=1),
    "twosome": dict(epochs=1, num_minibatches=4, ent_coef=0.01, loss_chunks=1),
}


def get_config(method: str | None = None):  # None: an error naming the methods
    # configs/overcooked.py holds the task and the paper's row for it (threads x steps, env steps,
    # gamma, learning rates, bfloat16 matmuls on CPU); this preset adds the authors' per-method
    # settings and semantics.
    config = poad_config.load_config_file(pathlib.Path(__file__).with_name("overcooked.py"))
    config.name = "overcooked_paper"
    return poad_config.set_authors_semantics(config, "configs/overcooked_paper.py", method, PAPER_METHODS)
