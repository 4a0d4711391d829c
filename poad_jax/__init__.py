"""poad_jax: POAD, NTPO and TWOSOME for language agents in JAX / Flax NNX.

The package is layered (docs/architecture.md).  Config files written before the
layers start `from poad_jax import config`: that name still resolves, to
`poad_jax.run.config`, with a FutureWarning (shown to users) that says the new path.
"""

import importlib
import warnings

__version__ = "0.1.0"

_MOVED = {"config": "poad_jax.run.config"}  # old top-level name -> its module now


def __getattr__(name: str):
    if name in _MOVED:
        warnings.warn(f"poad_jax.{name} is now {_MOVED[name]}: write `from poad_jax.run import {name}`",
                      FutureWarning, stacklevel=2)
        return importlib.import_module(_MOVED[name])
    raise AttributeError(f"module 'poad_jax' has no attribute {name!r}")
