"""DataSciCoding: write a scikit-learn `build_model`, scored by ROC AUC in a sandbox.

Registers `datasci/<dataset>` for every dataset.  Importing this package
loads no data and imports neither scikit-learn nor the sandbox: `make`
builds the env (and loads its data) on demand.

    import envs_py
    env = envs_py.make("datasci/balance_scale", template="chat")
    obs = env.reset()
    result = env.step("```python\\n...\\n```")
"""

from envs_py.registry import register

from envs_py.datasci.names import DATASET_NAMES  # noqa: E402

for _name in DATASET_NAMES:
    register(
        f"datasci/{_name}",
        "envs_py.datasci.env:DataSciEnv",
        f"DataSciCoding on {_name}: write build_model, reward = mean ROC AUC (or -1 on failure)",
        dataset=_name,
    )


def load_dataset(name, data_dir=None):
    """Returns (X, y) of a dataset; see `envs_py.datasci.datasets.load_dataset`."""
    from envs_py.datasci.datasets import load_dataset as _load

    return _load(name, data_dir)


__all__ = ["DATASET_NAMES", "load_dataset"]
