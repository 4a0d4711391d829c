"""The agent: what each method decides (`methods`: the three methods and their
credit schemes), acting in the environments (`rollout`), the episodes'
bookkeeping (`episodes`), a rollout's records becoming the learner's
`TokenBatch` (`experience`), and the compiled PPO update (`learner`, and
`sharded_update` on a device mesh).  Knows no configuration files."""
