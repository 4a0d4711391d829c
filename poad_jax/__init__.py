"""poad_jax: POAD, NTPO and TWOSOME for language agents in JAX / Flax NNX."""

__version__ = "0.1.0"
