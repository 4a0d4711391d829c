"""The learner's settings (`config.ppo`), declared once beside the update that reads them.

`LearnerConfig` is both the declaration and the object the compiled update
runs on: each field's default (the paper's, docs/adrl_parity.md: PPO clip 0.2,
value clip 0.2, value coefficient 0.5, max grad norm 0.5, KL threshold 0.02,
λ 0.95, Adam ε 1e-5; γ and the rates are the paper's VirtualHome row), type,
one-line meaning and check sit in one `setting(...)` (`poad_jax.declare`);
`run.config` makes `config.ppo` from them, checks it, and builds this object
back once (`run.config.typed(config).ppo`, or `learner_config(config)`).
Two fields are not `ppo` settings but derived at that boundary from other
sections: `temperature` (`sampling.temperature`) and `critic_kind`
(`critic.kind`).  A mode string is a `Literal` type: its values are its check.

No JAX: a config file loads without it.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from poad_jax.core.critic_config import CriticKind
from poad_jax.declare import above, at_least, derived, hold_to_declarations, setting, within

KlSkip = Literal["update", "actor"]
AdvantageNormalization = Literal["valid", "adrl"]
LambdaScope = Literal["token", "action"]
EntropyScope = Literal["policy", "offered"]
BehaviourCorrection = Literal["none", "importance"]

_RATE_WHY = "a negative rate would ascend the loss"


@dataclasses.dataclass(frozen=True, kw_only=True)
class LearnerConfig:
    """PPO's hyper-parameters (`config.ppo`), and the two values the update takes from other sections."""

    gamma: float = setting(0.95, "the discount per env step", within(0, 1, open_low=True))
    lam: float = setting(0.95, "GAE's lambda", within(0, 1))
    clip_eps: float = setting(0.2, "PPO's ratio clip", above(0, "PPO's ratio clip; 0 would stop all learning"))
    value_clip_eps: float = setting(0.2, "the value loss's clip around the old values", above(0))
    vf_coef: float = setting(0.5, "the value loss's coefficient", at_least(0))
    ent_coef: float = setting(0.01, "the entropy bonus's coefficient",
                              at_least(0, "a negative coefficient would reward collapsing the policy"))
    max_grad_norm: float = setting(0.5, "gradients are clipped to this global norm", above(0))
    target_kl: float = setting(0.02, "a minibatch whose approximate KL exceeds it is skipped", above(0))
    epochs: int = setting(1, "passes over the rollout per update", at_least(1, "0 epochs would train nothing"))
    num_minibatches: int = setting(4, "minibatches per epoch", at_least(1))
    accumulation_steps: int = setting(1, "micro-batches per minibatch (bounds activation memory)", at_least(1))
    actor_lr: float = setting(1e-6, "the actor's Adam learning rate", at_least(0, _RATE_WHY))
    critic_lr: float = setting(5e-5, "the critic's Adam learning rate", at_least(0, _RATE_WHY))
    adam_eps: float = setting(1e-5, "Adam's epsilon", above(0))
    normalize_advantages: bool = setting(True, "normalise advantages over each minibatch")
    # The authors' semantics where they differ from ours (docs/adrl_parity.md):
    kl_skip: KlSkip = setting(
        "update", "what a minibatch over the KL threshold skips: actor and critic (ours), or the actor "
        "(the authors' code: the critic has already stepped)")
    advantage_normalization: AdvantageNormalization = setting(
        "valid", "mean/std over the minibatch's valid elements (ours), or as the authors' code "
        "(token level: the non-zero advantages; action level: each loss chunk's, unbiased std)")
    loss_chunks: int = setting(
        1, "the policy loss, entropy and approximate KL as the mean of this many equal row chunks' "
        "token means (the authors' gradient_cp_steps)", at_least(1, "1: one token mean over the minibatch"))
    lambda_scope: LambdaScope = setting(
        "token", "token-level methods: lambda at every token, or where gamma applies (an action's last "
        "token; 1 inside an action: POAD's first-token advantage is action-level GAE, docs/backups.md)")
    entropy_scope: EntropyScope = setting(
        "policy", "the entropy bonus of the distribution the log-probs are taken under, or over the "
        "offered continuations (the trie's renormalised next-token distribution)")
    behaviour_correction: BehaviourCorrection = setting(
        "none", "PPO's ratio as usual, or restricted actions optimise the trie policy and each token's "
        "clipped surrogate is weighted by min(importance_weight_clip, pi_old / mu) "
        "(docs/results/virtualhome_options.md, study B)")
    importance_weight_clip: float = setting(1.0, "the largest weight a token's surrogate gets",
                                            above(0, "0 would weight every surrogate by 0"))
    ref_kl_coef: float = setting(
        0.0, "grpo/gigpo: the coefficient of a per-token KL penalty to the frozen base model (the k3 "
        "estimator, clipped to [-10, 10]; verl-agent's examples use 0.01); 0: off",
        at_least(0, "0 turns the penalty off"))
    temperature: float = derived("the sampling temperature the log-probs are taken at (sampling.temperature)")
    critic_kind: CriticKind = derived("which critic the update trains (critic.kind)")

    def __post_init__(self):
        hold_to_declarations(self)
