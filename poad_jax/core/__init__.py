"""The math every method shares, as pure functions: token GAE (`gae`), the PPO
losses, advantage normalisations and behaviour correction (`losses`), the
means an update reports over its minibatch steps (`step_statistics`), the `TokenBatch` and its streams (`token_batch`), the
actor and critic over a frozen base (`policy`), shape buckets and action
tries (`layout`), FLOP counts (`flops`), GRPO's and GiGPO's group-relative
advantages (`group_advantages`), and the same backups in NumPy on finite
language MDPs, with which the tests prove them (`tabular`).  Imports only `poad_jax.models`."""
