"""VirtualHome food preparation (paper §6.1): gamma 0.95, actor lr 1e-6, critic lr 5e-5, 4 x 32, 6k steps.

Other tasks: --config.env.name=virtualhome/entertainment (and the
generalisation variants, for evaluation).
"""

from poad_jax.run import config as poad_config


def get_config():
    config = poad_config.default_config()
    config.name = "virtualhome"
    config.env.name = "virtualhome/food_preparation"
    config.prompt_format = "raw"
    config.num_threads = 4
    config.rollout_length = 32
    config.total_env_steps = 6_000
    config.sampling.temperature = 1.0
    config.ppo.gamma = 0.95
    config.ppo.actor_lr = 1e-6
    config.ppo.critic_lr = 5e-5
    config.matmul_dtype = "bfloat16"  # CPU speed: see poad_jax/run/config.py; "float32" for exact matmuls
    return config
