"""DataSciCoding (paper §6.2): write the body of build_model(x_train, y_train).

Default: POAD on balance_scale (fully offline) with the embedded
SmolLM2-135M-Instruct, sized to finish within 15 minutes on a 2-core CPU:
2 updates of 4 threads x 4 steps with bfloat16 matmuls (measured: 3 min 52 s
from an empty compilation cache).  The code-capable model is the preset
configs/datasci_qwen.py.  Paper scale (a GPU):
--config.rollout_length=8 --config.total_env_steps=10000.
"""

from poad_jax import config as poad_config


def get_config():
    config = poad_config.default_config()
    config.name = "datasci"
    config.env.name = "datasci/balance_scale"
    # Retry prompts quote the error and the previous code; these caps keep a
    # retry prompt under ~450 tokens (the learner's cost grows with it).
    # allow_unsandboxed=True runs model-written code even without bubblewrap (unsafe; README).
    config.env.kwargs = dict(template="chat", max_attempts=5, timeout_s=30.0, error_chars=300, code_chars=1000,
                             allow_unsandboxed=False)
    config.env.vector_mode = "threads"  # a step waits on the sandbox subprocess
    config.prompt_format = "chat"
    config.matmul_dtype = "bfloat16"  # CPU speed: see poad_jax/config.py; "float32" for exact matmuls
    config.num_threads = 4
    config.rollout_length = 4  # the paper: 8
    config.total_env_steps = 32  # CPU default; the paper ran 10k env steps
    config.sampling.temperature = 0.5
    config.sampling.top_k = 50
    config.sampling.max_new_tokens = 128
    config.ppo.gamma = 0.95
    config.ppo.actor_lr = 1e-6
    config.ppo.critic_lr = 5e-5
    config.ppo.num_minibatches = 2
    config.ppo.accumulation_steps = 2  # micro-batches of 4 rows bound activation memory
    return config
