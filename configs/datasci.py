"""DataSciCoding (paper §6.2): write the body of build_model(x_train, y_train).

Default: POAD on balance_scale (fully offline) with the embedded
SmolLM2-135M-Instruct, sized to finish within 15 minutes on a 2-core CPU.
Paper scale: --config.total_env_steps=10000 (and a GPU).
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location(
    "poad_configs_load_base", pathlib.Path(__file__).with_name("_load_base.py")
)
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)


def get_config():
    config = _module.base_config()
    config.name = "datasci"
    config.env.name = "datasci/balance_scale"
    config.env.kwargs = dict(template="chat", max_attempts=5, timeout_s=30.0)
    config.env.vector_mode = "threads"  # a step waits on the sandbox subprocess
    config.prompt_format = "chat"
    config.num_threads = 4
    config.rollout_length = 8
    config.total_env_steps = 64  # CPU default; the paper ran 10k env steps
    config.sampling.temperature = 0.5
    config.sampling.top_k = 50
    config.sampling.max_new_tokens = 128
    config.ppo.gamma = 0.95
    config.ppo.actor_lr = 1e-6
    config.ppo.critic_lr = 5e-5
    config.ppo.num_minibatches = 4
    return config
