"""DataSciCoding with the small SmolLM2-135M-Instruct: a quick smoke run of the whole loop.

configs/datasci.py with SmolLM2 and 128 new tokens, 2 updates of 4 threads
x 4 steps (about 4 minutes on a 2-core CPU).  It shows what a run does and
reports, not learning: SmolLM2 almost never writes runnable scikit-learn
code (0 of 16 before training), so its programs earn only the failure
reward.  This was the default job before the code model became it.
"""

import pathlib

from poad_jax.run import config as poad_config


def get_config():
    config = poad_config.load_config_file(pathlib.Path(__file__).with_name("datasci.py"))
    config.name = "datasci_smollm2"
    config.model = "smollm2-135m-instruct"
    config.sampling.max_new_tokens = 128
    config.num_threads = 4
    config.rollout_length = 4
    config.total_env_steps = 32
    config.ppo.accumulation_steps = 2  # micro-batches of 4 rows
    return config
