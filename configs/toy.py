"""Toy decisive-token task with a tiny random model: a seconds-long smoke run of the whole pipeline."""

from poad_jax.run import config as poad_config


def get_config():
    config = poad_config.default_config()
    config.name = "toy"
    config.model = "tiny-random"
    config.env.name = "toy/decisive_token"
    config.env.kwargs = dict(horizon=2, num_colours=3, rewarded="blue")
    config.prompt_format = "raw"
    config.num_threads = 4
    config.rollout_length = 4
    config.total_env_steps = 16 * 40
    config.ppo.gamma = 0.95
    config.ppo.actor_lr = 3e-3
    config.ppo.critic_lr = 3e-3
    config.ppo.num_minibatches = 2
    config.ppo.epochs = 2
    config.ppo.target_kl = 1.0
    config.critic.hidden_sizes = (64, 64)
    return config
