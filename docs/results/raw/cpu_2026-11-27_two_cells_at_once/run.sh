#!/usr/bin/env bash
# usage: run.sh NAME [taskset-core] [xla-flags]
cd /work/wt_study
name=$1; core=$2; flags=$3
rm -rf /tmp/thr/$name
pre=""; [ -n "$core" ] && pre="taskset -c $core"
XLA_FLAGS="$flags" $pre .venv/bin/python -m poad_jax.train --config=configs/virtualhome_paper.py:poad \
  --workdir=/tmp/thr/$name --config.total_env_steps=320 --config.rollout_length=8 \
  --config.ppo.actor_lr=1e-4 --config.ppo.epochs=1 --config.ppo.num_minibatches=4 --config.ppo.loss_chunks=1 \
  --config.ppo.ent_coef=0.01 --config.seed=7 > /tmp/thr/$name.log 2>&1
