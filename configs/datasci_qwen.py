"""The preset of studies/datasci_qwen.py: the default configs/datasci.py
(Qwen2.5-Coder-0.5B-Instruct, 256 new tokens, matmul_dtype "auto") with the
study's rollout shape, 4 threads x 4 steps per update.

Kept as the study ran it, so that its published cells stay resumable
(tests/test_study.py compares them with docs/results/raw/).
"""

import pathlib

from poad_jax.run import config as poad_config


def get_config():
    config = poad_config.load_config_file(pathlib.Path(__file__).with_name("datasci.py"))
    config.name = "datasci_qwen"
    # configs/datasci.py's training settings when the study ran (they moved after studies/datasci_settings.py)
    config.ppo.actor_lr = 1e-6
    config.ppo.lambda_scope = "token"
    config.num_threads = 4
    config.rollout_length = 4
    config.total_env_steps = 32
    # The numerics its study ran with (studies/datasci_qwen.py, docs/results/raw/datasci_qwen), before
    # configs/datasci.py chose them from the machine ("auto"), and what its learner's layer scan kept for the
    # backward pass before configs/datasci.py chose "dots" (the same numbers, computed with more recomputation).
    config.matmul_dtype = "bfloat16"
    config.behaviour_logprobs = "recompute"
    config.remat = "full"
    config.prefix_packing = False  # rows as they were (the same numbers to rounding, packed: issue 41)
    config.sampling.share_prompts = False
    return config
