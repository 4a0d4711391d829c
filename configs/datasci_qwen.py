"""DataSciCoding with the code-capable embedded model, Qwen2.5-Coder-0.5B-Instruct.

The same run as configs/datasci.py with the model that writes runnable
scikit-learn code (12 of 16 samples before training, against SmolLM2's 0;
README, "Which embedded model") and 256 new tokens (at 128 most of its
programs are cut off).  On the 2-core CPU one update of 16 env steps takes
about 6.7 min warm (sampling 4.4 min), so the 2-update run takes about
14 min with warm caches: hence not the default, whose command must finish
within 15 minutes on a fresh machine.
"""

import pathlib

from poad_jax import config as poad_config


def get_config():
    config = poad_config.load_config_file(pathlib.Path(__file__).with_name("datasci.py"))
    config.name = "datasci_qwen"
    config.model = "qwen2.5-coder-0.5b-instruct"
    config.sampling.max_new_tokens = 256
    return config
