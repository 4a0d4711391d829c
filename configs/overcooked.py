"""Overcooked tomato salad (paper §6.1): gamma 0.99, actor lr 5e-7, critic lr 1e-5, 4 x 32, 40k steps.

Other task: --config.env.name=overcooked/tomato_lettuce_salad
"""

from poad_jax.run import config as poad_config


def get_config():
    config = poad_config.default_config()
    config.name = "overcooked"
    config.env.name = "overcooked/tomato_salad"
    config.prompt_format = "raw"
    config.num_threads = 4
    config.rollout_length = 32
    config.total_env_steps = 40_000
    config.sampling.temperature = 1.0
    config.ppo.gamma = 0.99
    config.ppo.actor_lr = 5e-7
    config.ppo.critic_lr = 1e-5
    # bfloat16 operands (float32 accumulation): the studies' numerics, fast on a GPU or a CPU with AVX-512-BF16
    # or AMX; elsewhere --config.matmul_dtype=auto (float32 there) is faster and exact (run/hardware.py)
    config.matmul_dtype = "bfloat16"
    return config
