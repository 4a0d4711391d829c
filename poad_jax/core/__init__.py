"""The math every method shares, as pure functions: token GAE (`gae`), the PPO
losses (`losses`), the `TokenBatch` and its streams (`token_batch`), the
actor and critic over a frozen base (`policy`), shape buckets and action
tries (`layout`) and FLOP counts (`flops`).  Imports only `poad_jax.models`."""
