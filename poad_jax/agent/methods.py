"""POAD, NTPO, TWOSOME, GRPO and GiGPO: which discounts or group advantages, what one stream
element is, and all that follows.

| method  | stream element      | discount inside an action | at an action's end |
|---------|---------------------|---------------------------|--------------------|
| poad    | one action token    | 1 (BAD)                   | gamma (1 - done)   |
| ntpo    | one action token    | gamma_w (= gamma default) | gamma (1 - done)   |
| twosome | one whole action    | (none)                    | gamma (1 - done)   |
| grpo    | one action token    | critic-free: each step row's group-relative advantage on |
| gigpo   |                     | every token of its action (`GroupRelative`)              |

TWOSOME with `gamma_w < 1` (an ablation, not the paper's TWOSOME) discounts
each action as if its n tokens were time steps, as NTPO does:
d = gamma * gamma_w**(n - 1) * (1 - done) at the action's end.

POAD, NTPO and TWOSOME run the same token-level GAE scan (`poad_jax.core.gae`);
GRPO and GiGPO run no critic: their advantages are computed on the host from
each group of trajectories (`GroupRelative`, `poad_jax.core.group_advantages`).
Everything a method decides lives in this module: the table above
(`make_method`) and the credit schemes behind it.

Credit schemes: two schemes serve the five methods (`make_method` maps a
method to its scheme and discount):

- `TokenLevel` (POAD, NTPO, and GRPO and GiGPO, whose step rows are laid out
  as POAD's with gamma_w 1): a stream element is one action token.  A batch
  row is `prompt + chosen action` `[N, P + A]`; the policy is the token
  distribution the sampler drew from (restricted to the trie of valid actions
  where there is one); the critic, where the method has one, reads V(o, w^{<j})
  at every action token.
- `ActionLevel` (TWOSOME): a stream element is one whole action.  A batch
  row carries every candidate action of the state `[N, K, P + A]`; the policy
  is the softmax over candidates of their normalised summed token log-probs;
  the critic reads V(o).

Each scheme owns its batch layout (`pack`), the streams and discounts of the
backups (`streams`), the rows' valid elements (`valid`), its log-prob and
entropy computation (`policy`) and its critic input (`critic_features`).  The
learner and the behaviour pass call these and never branch on the method.
Every method is jit-traceable; `pack` runs on the host (NumPy).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from poad_jax.agent.method_config import MethodConfig
from poad_jax.core import gae, group_advantages
from poad_jax.core.flops import Pass, SchemePasses, shared_prompt_pass
from poad_jax.core.layout import COUNT_BUCKETS, allowed_next_tokens, bucket_size
from poad_jax.core.policy import (
    FrozenBase,
    PackedRows,
    PolicyGraph,
    action_level_log_policy,
    action_policy_terms,
    base_features,
    candidate_token_logprobs,
)
from poad_jax.core.shared_prefix import PrefixPlan
from poad_jax.core.token_batch import action_streams, pack_rows, token_streams
from poad_jax.sampling import action_normalizers


@dataclasses.dataclass(frozen=True)
class TokenLevel:
    """POAD (gamma_w = 1, BAD) and NTPO (gamma_w < 1): one stream element per action token.

    Attributes:
      gamma_w: the discount between two tokens of one action.
      offered_continuations: restricted actions drawn from the action scores
        (`restricted_sampling="action_scores"`) also pack the trie's offered
        continuations, for an entropy (`ppo.entropy_scope="offered"`) or
        log-probs (`ppo.behaviour_correction="importance"`) over them; trie
        sampling always packs them.
      vocabulary_logprobs: the log-probs stay those of the full-vocabulary
        softmax where the offered continuations are packed (the paper code's
        optimisation, with only the entropy over the offered set).
    """

    gamma_w: float = 1.0
    offered_continuations: bool = False
    vocabulary_logprobs: bool = False
    token_level = True  # class attribute (for readers and notebooks), not a field
    scores_candidates = False  # restricted actions are sampled token by token (trie)
    share_prompt = True  # one row per step: its prompt is encoded once (packing several rows'
    # common prompt prefix once is `prefix_packing`, the batch's `prefix_plan`)

    def pack(self, rows, prompt_len: int, config, pad_id: int) -> dict[str, np.ndarray]:
        """tokens/positions/key_mask `[N, P + A]`, action_mask `[N, A]` and, for
        trie-sampled restricted actions, the trie's allowed tokens `[N, A, M]`."""
        action_len = bucket_size(max(len(r.action_tokens) for r in rows), config.action_buckets)
        arrays = pack_rows([r.prompt for r in rows], [r.action_tokens for r in rows], prompt_len, action_len, pad_id)
        constrained = rows[0].candidates is not None and (
            config.restricted_sampling == "trie" or self.offered_continuations)
        width = bucket_size(max(len(r.candidates) for r in rows), COUNT_BUCKETS) if constrained else 1
        allowed_tokens = np.zeros((len(rows), action_len, width), np.int32)
        allowed_mask = np.zeros((len(rows), action_len, width), bool)
        if constrained:
            for n, r in enumerate(rows):
                allowed_tokens[n], allowed_mask[n] = allowed_next_tokens(
                    r.action_tokens, r.candidates, action_len, width
                )
        arrays.update(allowed_tokens=allowed_tokens, allowed_mask=allowed_mask)
        return arrays

    def streams(self, batch, gamma: float) -> dict[str, jax.Array]:
        """Per-thread token streams `[B, T * A]` and their discounts (1 or gamma_w
        inside an action, gamma (1 - done) at its end)."""
        streams = token_streams(batch)
        streams["discounts"] = gae.action_discounts(
            streams["action_end"], streams["dones"], gamma, self.gamma_w
        )
        return streams

    def valid(self, batch) -> jax.Array:
        """`[N, A]`: the real action tokens."""
        return batch.action_mask

    def policy(self, graph: PolicyGraph, frozen: FrozenBase, actor_lora, batch, temperature: float):
        """(log pi(w_j), entropy) `[N, A]` of softmax(logits / T), trie-restricted where constrained."""
        logprobs, entropy, _ = self.policy_terms(graph, frozen, actor_lora, batch, temperature)
        return logprobs, entropy

    def policy_terms(self, graph: PolicyGraph, frozen: FrozenBase, actor_lora, batch, temperature: float):
        """(log pi(w_j), entropy, {"entropy_vocabulary", "entropy_offered"}) `[N, A]` of
        softmax(logits / T): the log-probs and the entropy over the offered continuations
        where they are packed (over the full vocabulary elsewhere), except that
        `vocabulary_logprobs` keeps the log-probs over the full vocabulary."""
        terms = action_policy_terms(graph, frozen, actor_lora, PackedRows.of(batch, batch.prefix_plan), temperature,
                                    batch.allowed_tokens, batch.allowed_mask)
        logprobs = terms.logprobs_vocabulary if self.vocabulary_logprobs else terms.logprobs_offered
        entropies = {"entropy_vocabulary": terms.entropy_vocabulary, "entropy_offered": terms.entropy_offered}
        return logprobs, terms.entropy_offered, entropies

    def passes(self, tokens_shape, action_len: int, prefix_plan: PrefixPlan | None = None) -> SchemePasses:
        """The decoder passes `policy` and `critic_features` run over a batch `[N, P + A]`:
        both over every row; the policy's logits at the A action columns; N A values.  With a
        `prefix_plan` (`core/shared_prefix.py`): over N / m packed sequences of T columns, m A
        logits each."""
        rows, length = tokens_shape
        if prefix_plan is not None:
            groups, m = rows // prefix_plan.group_rows, prefix_plan.group_rows
            return SchemePasses(Pass(groups, prefix_plan.packed_len, m * action_len),
                                Pass(groups, prefix_plan.packed_len), rows * action_len)
        return SchemePasses(Pass(rows, length, action_len), Pass(rows, length), rows * action_len)

    def critic_features(self, graph: PolicyGraph, frozen: FrozenBase, lora, batch, use_lora: bool) -> jax.Array:
        """`[N, A, H]`: hidden states before each action token, V(o, w^{<j})'s input."""
        return base_features(graph, frozen, lora, PackedRows.of(batch, batch.prefix_plan), use_lora=use_lora)


@dataclasses.dataclass(frozen=True)
class ActionLevel:
    """TWOSOME: one stream element per action, the policy a softmax over the candidates.

    Attributes:
      gamma_w: 1 for the paper's TWOSOME; below 1, an action of n tokens is
        discounted by an extra gamma_w**(n - 1) (an ablation).
      share_prompt: encode each state's prompt once and let every candidate
        attend to it (True), or run each candidate as its own prompt + action
        row (False, the reference computation; K times the prompt's cost).
    """

    gamma_w: float
    share_prompt: bool
    token_level = False
    scores_candidates = True  # acts by scoring every valid action (needs a restricted action set)

    def pack(self, rows, prompt_len: int, config, pad_id: int) -> dict[str, np.ndarray]:
        """tokens/positions/key_mask `[N, K, P + A]` (K = most candidates of a
        state, rounded up to a bucket so the compiled passes are reused;
        padding candidates repeat the last one and are masked out),
        action_mask `[N, K, A]`, chosen `[N]`, candidate_mask and normalizer `[N, K]`."""
        num_candidates = bucket_size(max(len(r.candidates) for r in rows), COUNT_BUCKETS)
        action_len = bucket_size(max(len(c) for r in rows for c in r.candidates), config.action_buckets)
        prompts, actions = [], []
        candidate_mask = np.zeros((len(rows), num_candidates), bool)
        normalizer = np.ones((len(rows), num_candidates), np.float32)
        for n, r in enumerate(rows):
            for k in range(num_candidates):
                prompts.append(r.prompt)
                actions.append(r.candidates[min(k, len(r.candidates) - 1)])
            candidate_mask[n, : len(r.candidates)] = True
            normalizer[n, : len(r.candidates)] = action_normalizers(
                r.candidates, r.candidate_texts, config.twosome_normalization
            )
        flat = pack_rows(prompts, actions, prompt_len, action_len, pad_id)
        arrays = {key: value.reshape(len(rows), num_candidates, -1) for key, value in flat.items()}
        arrays.update(
            chosen=np.array([r.chosen for r in rows], np.int32),
            candidate_mask=candidate_mask,
            normalizer=normalizer,
        )
        return arrays

    def streams(self, batch, gamma: float) -> dict[str, jax.Array]:
        """Per-thread action streams `[B, T]`; discount gamma (1 - done) per action,
        times gamma_w**(n_tokens - 1) of the taken action when gamma_w < 1."""
        streams = action_streams(batch)
        discounts = gae.action_discounts(streams["action_end"], streams["dones"], gamma, 1.0)
        if self.gamma_w != 1.0:
            discounts = discounts * action_token_discounts(batch, self.gamma_w).reshape(discounts.shape)
        streams["discounts"] = discounts
        return streams

    def valid(self, batch) -> jax.Array:
        """`[N]`: every row is one real action."""
        return jnp.ones(batch.rewards.shape, bool)

    def policy(self, graph: PolicyGraph, frozen: FrozenBase, actor_lora, batch, temperature: float):
        """(log pi(chosen action), entropy over the candidates) `[N]`.  The
        candidates' token log-probs are taken at temperature 1 (TWOSOME scores
        actions by their likelihood; the sampler does the same)."""
        del temperature
        token_logprobs = candidate_token_logprobs(graph, frozen, actor_lora, PackedRows.of(batch), self.share_prompt)
        log_pi = action_level_log_policy(token_logprobs, batch.action_mask, batch.normalizer, batch.candidate_mask)
        logprobs = jnp.take_along_axis(log_pi, batch.chosen[:, None], axis=-1)[:, 0]
        entropy = -jnp.sum(jnp.exp(log_pi) * log_pi, axis=-1)
        return logprobs, entropy

    def policy_terms(self, graph: PolicyGraph, frozen: FrozenBase, actor_lora, batch, temperature: float):
        """(log pi(chosen action), entropy, {"entropy_offered"}) `[N]`: the entropy is
        over the offered actions already (the only one TWOSOME has)."""
        logprobs, entropy = self.policy(graph, frozen, actor_lora, batch, temperature)
        return logprobs, entropy, {"entropy_offered": entropy}

    def passes(self, tokens_shape, action_len: int) -> SchemePasses:
        """The decoder passes `policy` and `critic_features` run over a batch `[N, K, P + A]`.
        Policy, prompt shared: `flops.shared_prompt_pass`; per candidate: N K rows of P + A with
        logits at the A action columns.  Critic: candidate 0's row; N values."""
        rows, candidates, length = tokens_shape
        if self.share_prompt:
            policy = shared_prompt_pass(rows, length - action_len, candidates, action_len)
        else:
            policy = Pass(rows * candidates, length, action_len)
        # The prompt-shared scoring computes its logits itself (`shared_prompt_token_logprobs`), not row by row.
        return SchemePasses(policy, Pass(rows, length), rows, policy_rowwise=not self.share_prompt)

    def critic_features(self, graph: PolicyGraph, frozen: FrozenBase, lora, batch, use_lora: bool) -> jax.Array:
        """`[N, H]`: the hidden state at the prompt's last token, V(o)'s input."""
        prompts = PackedRows(batch.tokens[:, 0], batch.positions[:, 0], batch.key_mask[:, 0], batch.prompt_len)
        return base_features(graph, frozen, lora, prompts, use_lora=use_lora)[:, 0]


def action_token_discounts(batch, gamma_w: float) -> jax.Array:
    """`[N]` extra discount of each taken action, counting its tokens as steps:

        gamma_w ** (n_tokens(chosen action) - 1)

    (action level only; 1 for every action when gamma_w = 1).
    """
    lengths = batch.action_mask.sum(-1)  # [N, K]
    chosen_length = jnp.take_along_axis(lengths, batch.chosen[:, None], axis=1)[:, 0]
    return jnp.asarray(gamma_w, jnp.float32) ** jnp.maximum(chosen_length - 1, 0).astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class GroupRelative:
    """GRPO and GiGPO: critic-free advantages from groups of trajectories that start from one state
    (`core/group_advantages.py`; docs/group_methods.md).  Each step row's advantage goes to every
    token of its action; the token policy (through the trie where actions are restricted) is both
    sampled and optimised.

    Attributes:
      kind: "grpo" (the episode level: a trajectory's return normalised within its group) or
        "gigpo" (plus `config.omega` times the step level: the discounted return from a step
        normalised within the steps of its group that saw the same observation).
      config: the groups' settings as declared (`config.group`: its size, normalisation and
        GiGPO's weight and similarity).
      num_threads: the run's rollout threads (a group size of 0 groups them all).
      gamma: GiGPO's step level's discount (the learner's `ppo.gamma`).
    """

    kind: str
    config: group_advantages.GroupConfig
    num_threads: int
    gamma: float

    @property
    def size(self) -> int:
        """Trajectories per group (threads `g * size ... (g + 1) * size - 1` form group g)."""
        return self.config.group_size(self.num_threads)

    def advantages(self, reward: np.ndarray, thread: np.ndarray, t: np.ndarray, observations: list[str]) -> np.ndarray:
        """`[n]` float64 advantages of n step rows (padding left out), each row's thread (its
        trajectory: one per thread and update), step index and observation text."""
        group, config = np.asarray(thread) // self.size, self.config
        if self.kind == "grpo":
            return group_advantages.grpo_advantages(reward, group, thread, config.mode, config.epsilon)
        return group_advantages.gigpo_from_observations(
            reward, group, thread, t, observations, gamma=self.gamma, omega=config.omega, epsilon=config.epsilon,
            mode=config.mode, similarity=config.similarity).adv


# ---------------------------------------------------------------------------
# The methods.

METHODS = ("poad", "ntpo", "twosome", "grpo", "gigpo")
GROUP_METHODS = ("grpo", "gigpo")


class UnknownMethodError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class Method:
    """A credit-assignment method: a name and its credit scheme.

    Attributes:
      name: "poad", "ntpo", "twosome", "grpo" or "gigpo".
      scheme: `TokenLevel(gamma_w)` or `ActionLevel(gamma_w, share_prompt)`.
      group: GRPO's and GiGPO's groups (`GroupRelative`); None for the methods with a critic.
    """

    name: str
    scheme: TokenLevel | ActionLevel
    group: GroupRelative | None = None

    @property
    def uses_critic(self) -> bool:
        """False for the group-relative methods: no critic is run or trained, the advantages come
        from the group (`GroupRelative`) and are not normalised again per minibatch."""
        return self.group is None

    @property
    def token_level(self) -> bool:
        """True if a stream element is an action token."""
        return self.scheme.token_level

    @property
    def gamma_w(self) -> float:
        """The intra-action discount: per token for token-level methods; for the
        action level, an action of n tokens is discounted by an extra
        gamma_w**(n - 1) (1 for the paper's TWOSOME)."""
        return self.scheme.gamma_w

    @property
    def share_prompt(self) -> bool:
        """Each state's prompt encoded once (always at the token level; see `ActionLevel`)."""
        return self.scheme.share_prompt


def make_method(name: str, gamma: float, gamma_w: float | None = None,
                share_prompt: bool = MethodConfig.share_prompt, offered_continuations: bool = False,
                vocabulary_logprobs: bool = False, group: GroupRelative | None = None) -> Method:
    """The method `name`; `gamma_w` (`MethodConfig.gamma_w`) overrides NTPO's intra-action discount
    (None or negative: gamma) and TWOSOME's per-token discount of an action (None or negative: 1;
    POAD's is always 1).  `share_prompt` (`MethodConfig.share_prompt`; default the declared one):
    False gives TWOSOME's per-candidate computation (`ActionLevel`);
    `offered_continuations` and `vocabulary_logprobs` are POAD's and NTPO's (`TokenLevel`);
    `group` GRPO's and GiGPO's groups (required for them; their kind set from `name`)."""
    token_options = dict(offered_continuations=offered_continuations, vocabulary_logprobs=vocabulary_logprobs)
    gamma_w = None if gamma_w is not None and gamma_w < 0 else gamma_w
    if name in GROUP_METHODS:
        if group is None:
            raise ValueError(f"{name} needs its groups: make_method(..., group=GroupRelative(...))")
        return Method(name, TokenLevel(gamma_w=1.0), dataclasses.replace(group, kind=name))
    if name == "poad":
        return Method("poad", TokenLevel(gamma_w=1.0, **token_options))
    if name == "ntpo":
        return Method("ntpo", TokenLevel(gamma_w=gamma if gamma_w is None else gamma_w, **token_options))
    if name == "twosome":
        return Method("twosome", ActionLevel(gamma_w=1.0 if gamma_w is None else gamma_w, share_prompt=share_prompt))
    raise UnknownMethodError(f"unknown method {name!r}; choose one of {', '.join(METHODS)}")
