"""Rollouts: step text environments in Python, render the prompts, act with the sampler.

Each of the N env threads keeps its episode across updates.  One rollout is
`rollout_length` steps of every thread; the learner bootstraps from each
thread's next observation.  How an action is chosen:

- free-form envs (`Observation.actions is None`, e.g. DataSciCoding): token
  sampling with temperature / top-k / top-p (POAD, NTPO);
- restricted envs, POAD / NTPO: trie-constrained token sampling over the
  valid actions, so the behaviour and the optimised distributions coincide
  (`restricted_sampling="trie"`); or, as in the paper's code, sample from
  TWOSOME's normalised action distribution and optimise token probabilities
  (`restricted_sampling="action_scores"`);
- TWOSOME: score every valid action (summed token log-probs, normalised by
  token or word count) and sample from the softmax.

A rollout's step records become the learner's TokenBatch in
`agent/experience.py` (packing, the behaviour pass); the episodes are kept in
`agent/episodes.py`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import numpy as np

from envs_py import EnvError, Observation, VectorEnv, observation_digest
from poad_jax.agent.methods import Method
from poad_jax.core.policy import FrozenBase, PolicyGraph, merge_model
from poad_jax.agent.episodes import EpisodeStats
from poad_jax.agent.rollout_config import RolloutConfig
from poad_jax.sampling import Sampler


class FreeFormActionsError(ValueError):
    """TWOSOME met an environment that offers no actions to choose from (free-form text, e.g.
    DataSciCoding's programs): a user's choice of method, reported in one line."""


@dataclasses.dataclass
class StepRecord:
    prompt: list[int]
    action_tokens: list[int]
    reward: float
    done: bool
    candidates: list[list[int]] | None = None  # TWOSOME: every valid action's tokens
    candidate_texts: list[str] | None = None
    chosen: int = 0
    # The sampler's log pi of each action token as it decoded them (KV cache), for checks against
    # the behaviour pass's full forward (`bench logprob_gap`); None where the action was not sampled
    # token by token (TWOSOME's candidate scores) or is a stand-in (an empty generation's EOS).
    sampler_logprobs: list[float] | None = None
    # log mu(w_j | o, w^{<j}) of each action token under the distribution the action was drawn
    # from: the trie sampler's (at its temperature), or, for actions drawn from the action
    # scores, the scores' softmax marginalised onto the token prefix (`prefix_token_logprobs`).
    # None for free-form actions and TWOSOME.
    behaviour_logprobs: list[float] | None = None
    observation: str = ""  # the observation's text the action was taken from (GiGPO's anchor states)
    padding: bool = False  # an episodic rollout's step after its thread's episode ended: not trained on


class GroupResetError(ValueError):
    """An environment whose reset does not repeat a state for one seed, met by a group-relative method."""


class PromptRenderer:
    """Observation -> prompt token ids (chat template or raw text)."""

    def __init__(self, tokenizer, config: RolloutConfig):
        self.tokenizer = tokenizer
        self.config = config

    @property
    def action_prefix(self) -> str:
        """Text put before a restricted action: a space after a raw prompt, nothing after a chat turn."""
        return "" if self.config.prompt_format == "chat" else " "

    def __call__(self, observation: Observation) -> list[int]:
        if self.config.prompt_format == "chat":
            messages = []
            if self.config.system_prompt:
                messages.append({"role": "system", "content": self.config.system_prompt})
            messages.append({"role": "user", "content": observation.text})
            ids = list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True))
        else:
            ids = list(self.tokenizer.encode(observation.text))
        # Keep the end of an over-long prompt: it holds the question.
        return ids[-self.config.max_prompt_tokens :]


class RolloutCollector:
    """Steps N env threads with the current policy and packs TokenBatches.

    `env_steps` counts the run's env steps; step t of thread b is env step
    t * N + b + 1.  In a run over several processes, `take_thread_block`
    makes the collector one process's share of the run's threads.
    """

    def __init__(
        self,
        envs: VectorEnv,
        tokenizer,
        sampler: Sampler,
        method: Method,
        config: RolloutConfig,
        seed: int = 0,
    ):
        self.envs = envs
        self.tokenizer = tokenizer
        self.sampler = sampler
        self.method = method
        self.config = config
        self.render = PromptRenderer(tokenizer, config)
        self.np_rng = np.random.default_rng(seed)
        self.thread_offset = 0
        self.total_threads = envs.num_envs
        if config.group_size and envs.group_size != config.group_size:
            raise ValueError(f"group rollouts of {config.group_size} need envs seeded in groups of that size, "
                             f"got {envs.group_size}")
        self.observations: list[Observation] = envs.reset()
        self.check_group_observations()
        self.stats = EpisodeStats(running_return=[0.0] * envs.num_envs, discount=config.discounted_return_gamma)
        self.env_steps = 0
        self.timings = {"sampling": 0.0, "env": 0.0}

    def check_group_observations(self) -> None:
        """GroupResetError unless the threads of each group (episodic rollouts) start from one
        observation: their envs reset with one seed must repeat one state."""
        size = self.config.group_size
        for first in range(0, len(self.observations), size or len(self.observations)):
            if not size:
                return
            group = self.observations[first:first + size]
            for offset, observation in enumerate(group[1:], 1):
                if observation_digest(observation) != observation_digest(group[0]):
                    raise GroupResetError(
                        f"environment {self.envs.name!r}: threads {first} and {first + offset} were reset with one "
                        f"seed but start from different observations ({group[0].text[:60]!r} ... and "
                        f"{observation.text[:60]!r} ...); grpo and gigpo compare trajectories from one state, so "
                        f"the environment's reset(seed) must repeat its state")

    def take_thread_block(self, thread_offset: int, total_threads: int, seed) -> None:
        """Makes this collector one process's block of a multi-process run's
        threads: `envs` holds threads `thread_offset ... thread_offset +
        envs.num_envs - 1` of `total_threads`.  `env_steps` then counts the
        whole run's steps (every process steps its threads in lockstep with
        the others) and env step numbers are those one process stepping all
        threads would give (step t of thread g is t * total_threads + g + 1),
        so the processes' episode records merge in that order.  `seed`: the
        NumPy generator's new seed (e.g. (seed, process index))."""
        if not 0 <= thread_offset <= total_threads - self.envs.num_envs:
            raise ValueError(f"threads {thread_offset}..{thread_offset + self.envs.num_envs - 1} are not among "
                             f"the run's {total_threads}")
        self.thread_offset, self.total_threads = int(thread_offset), int(total_threads)
        self.np_rng = np.random.default_rng(seed)

    # -- acting -------------------------------------------------------------

    def _candidate_tokens(self, observation: Observation) -> list[list[int]]:
        prefix = self.render.action_prefix
        encoded = [list(self.tokenizer.encode(prefix + action)) for action in observation.actions]
        if not self.method.scheme.token_level:
            return encoded  # TWOSOME scores whole candidates: a prefix is just a shorter candidate
        return ended_where_prefixes(encoded, int(self.tokenizer.eos_token_ids[0]))

    def _act(self, prompts: list[list[int]], rng: jax.Array) -> list[StepRecord]:
        observations = self.observations
        restricted = [obs.actions is not None for obs in observations]
        if any(restricted) and not all(restricted):
            raise ValueError("all env threads must be either restricted or free-form")
        records = []
        if not restricted[0]:
            if self.method.scheme.scores_candidates:
                raise FreeFormActionsError("TWOSOME chooses among the actions an environment offers; this one "
                                           "offers none (its actions are free text): use method poad or ntpo")
            generation = self.sampler.generate(prompts, rng, self.config.sampling, self.tokenizer)
            for prompt, tokens, logprobs in zip(prompts, generation.tokens, generation.logprobs):
                sampled = [float(v) for v in logprobs] if len(tokens) else None
                tokens = list(tokens) or list(self.tokenizer.eos_token_ids[:1])
                records.append(StepRecord(prompt, tokens, 0.0, False, sampler_logprobs=sampled))
            return records

        candidates = [self._candidate_tokens(obs) for obs in observations]
        use_scores = self.method.scheme.scores_candidates or self.config.restricted_sampling == "action_scores"
        if use_scores:
            all_scores = self.sampler.score_actions_batch(
                prompts, candidates, normalization=self.config.twosome_normalization,
                action_texts=[list(obs.actions) for obs in observations],
            )
            for prompt, cands, obs, scores in zip(prompts, candidates, observations, all_scores):
                probs = np.asarray(scores.probs, np.float64)
                if self.config.sampling.temperature == 0:  # greedy evaluation
                    choice = int(np.argmax(probs))
                else:
                    choice = int(self.np_rng.choice(len(cands), p=probs / probs.sum()))
                record = StepRecord(prompt, cands[choice], 0.0, False, cands, list(obs.actions), choice)
                if not self.method.scheme.scores_candidates:
                    record.behaviour_logprobs = prefix_token_logprobs(cands, probs / probs.sum(), choice)
                records.append(record)
            return records
        temperature = self.config.sampling.temperature
        if self.config.trie_explore_temperature > 0 and temperature > 0:  # greedy evaluation stays greedy
            temperature = self.config.trie_explore_temperature
        generation = self.sampler.generate_constrained(prompts, candidates, rng, temperature=temperature)
        for prompt, cands, obs, index, logprobs in zip(prompts, candidates, observations, generation.action_index,
                                                       generation.logprobs):
            index = int(index)
            # The trie's end-of-action token, when one was decoded, is not among the action's tokens.
            sampled = [float(v) for v in logprobs[:len(cands[index])]]
            records.append(StepRecord(prompt, cands[index], 0.0, False, cands, list(obs.actions), index, sampled,
                                      behaviour_logprobs=sampled))
        return records

    def _action_text(self, record: StepRecord) -> str:
        if record.candidate_texts is not None:
            return record.candidate_texts[record.chosen]
        return self.tokenizer.decode(record.action_tokens, skip_special_tokens=True)

    def collect(self, rng: jax.Array, on_step=None, on_results=None) -> tuple[list[list[StepRecord]], list[list[int]]]:
        """Runs `rollout_length` steps of every thread with the sampler's current
        weights (`Sampler.set_lora` after each update).

        After each vector step, `on_results(results, first_env_step, actions)`
        sees the env's StepResults and the action texts that made them (local
        thread b's step is env step `first_env_step + b + 1`; the trainer keeps
        the best program from them and logs them with `log_actions`) and
        `on_step(num_new_env_steps)` is called (progress bars; the
        run's new steps, all processes').  Returns records[t][b] (b: this
        process's threads) and the prompts of each thread's next observation.
        """
        if self.config.group_size:
            return self.collect_episodes(rng, on_step, on_results)
        steps = []
        for _ in range(self.config.rollout_length):
            rng, step_rng = jax.random.split(rng)
            start = time.perf_counter()
            prompts = [self.render(obs) for obs in self.observations]
            records = self._act(prompts, step_rng)
            self.timings["sampling"] += time.perf_counter() - start
            start = time.perf_counter()
            actions = [self._action_text(r) for r in records]
            first_step = self.env_steps + self.thread_offset
            try:
                results = self.envs.step(actions)
            except EnvError as error:  # name the run's thread and env step (this process's thread b)
                error.thread, error.env_step = self.thread_offset + error.thread, first_step + error.thread + 1
                raise
            self.timings["env"] += time.perf_counter() - start
            for b, (record, result) in enumerate(zip(records, results)):
                record.reward = float(result.reward)
                record.done = bool(result.done)
                self.stats.record_step(b, record.reward, record.done, result.info, first_step + b + 1)
            self.observations = [result.observation for result in results]
            self.env_steps += self.total_threads
            steps.append(records)
            if on_results is not None:
                on_results(results, first_step, actions)
            if on_step is not None:
                on_step(self.total_threads)
        next_prompts = [self.render(obs) for obs in self.observations]
        return steps, next_prompts

    def collect_episodes(self, rng: jax.Array, on_step=None, on_results=None):
        """`collect` for the group-relative methods: one episode per thread, from the start of its
        group's episode to its end or `rollout_length` steps (then cut off: its return is what it
        earned so far, as verl-agent does).  A thread whose episode ended takes no more env steps:
        its later rows repeat its last step as padding (`StepRecord.padding`, not trained on), so
        the batch keeps its shape.  Env steps count the real steps only.  Every thread then
        starts its group's next episode (`VectorEnv.reset` with the next episode number), so a
        checkpoint holds no episode in progress."""
        episode = max(self.envs.episode_counters)  # every thread's, since the last reset
        active = [True] * self.envs.num_envs
        steps: list[list[StepRecord]] = []
        for _ in range(self.config.rollout_length):
            rng, step_rng = jax.random.split(rng)
            if not any(active):
                steps.append([dataclasses.replace(r, padding=True) for r in steps[-1]])
                continue
            start = time.perf_counter()
            prompts = [self.render(obs) for obs in self.observations]
            records = self._act(prompts, step_rng)
            self.timings["sampling"] += time.perf_counter() - start
            start = time.perf_counter()
            actions = [self._action_text(r) if on else None for r, on in zip(records, active)]
            first_step = self.env_steps
            try:
                results = self.envs.step(actions)
            except EnvError as error:
                error.env_step = first_step + sum(active[:error.thread]) + 1
                raise
            self.timings["env"] += time.perf_counter() - start
            taken = [b for b in range(len(active)) if active[b]]
            for k, b in enumerate(taken):
                record, result = records[b], results[b]
                record.reward, record.done = float(result.reward), bool(result.done)
                record.observation = self.observations[b].text
                self.stats.record_step(b, record.reward, record.done, result.info, first_step + k + 1)
                self.observations[b] = result.observation
                active[b] = not record.done
            for b in set(range(len(active))) - set(taken):
                records[b] = dataclasses.replace(steps[-1][b], padding=True)
            self.env_steps += len(taken)
            steps.append(records)
            if on_results is not None:
                on_results([results[b] for b in taken], first_step, [actions[b] for b in taken])
            if on_step is not None:
                on_step(len(taken))
        for b in (b for b in range(len(active)) if active[b]):
            self.stats.end_episode(b, self.env_steps)  # cut off at rollout_length
        self.observations = self.envs.reset([episode + 1] * self.envs.num_envs)
        self.check_group_observations()
        return steps, [self.render(obs) for obs in self.observations]


def ended_where_prefixes(candidates: list[list[int]], end_id: int) -> list[list[int]]:
    """`candidates` (token ids of one observation's actions), every one followed by `end_id` when
    one's ids are a strict prefix of another's; unchanged otherwise.

    A token-level policy chooses an action token by token, so where "walk to the pan" is a prefix
    of "walk to the pancake" (a tokenizer that splits " pan" + "cake"), stopping after " pan" must
    be a token too: the end token is then each action's last token, which the trie offers, the
    sampler draws and the learner scores like any other (identical candidates are not prefixes).
    """
    proper_prefixes = {tuple(c[:j]) for c in candidates for j in range(1, len(c))}
    if not any(tuple(c) in proper_prefixes for c in candidates):
        return candidates
    return [c + [end_id] for c in candidates]


def prefix_token_logprobs(candidates: list[list[int]], probs: np.ndarray, chosen: int) -> list[float]:
    """log mu(w_j | w^{<j}) of each token of candidate `chosen` when a whole candidate is drawn
    from `probs` (the action scores' softmax), marginalised onto token prefixes:

        mu(w_j | w^{<j}) = M(w^{<=j}) / M(w^{<j}),   M(p) = sum of probs[k] over candidates k that start with p

    (identical candidates add up; the end of an action that is a prefix of another is not a token).
    """
    action = candidates[chosen]
    probs = np.asarray(probs, np.float64)
    logprobs, mass = [], 1.0
    for j in range(len(action)):
        prefix = action[: j + 1]
        next_mass = float(sum(p for k, p in enumerate(probs) if candidates[k][: j + 1] == prefix))
        logprobs.append(float(np.log(next_mass) - np.log(mass)) if next_mass > 0 else float("-inf"))
        mass = next_mass
    return logprobs


def actions_cut_off(steps: list[list[StepRecord]], config: RolloutConfig) -> int:
    """How many free-form actions of a rollout (`collect`'s records) ended at
    `sampling.max_new_tokens` without a stop token: DataSciCoding's programs
    cut off by the token limit.  An action chosen among candidates is never cut off."""
    stop, limit = set(config.sampling.stop_token_ids), config.sampling.max_new_tokens
    return sum(1 for records in steps for record in records
               if record.candidates is None and len(record.action_tokens) >= limit
               and record.action_tokens[-1] not in stop)


def merged_actor(graph: PolicyGraph, frozen: FrozenBase, params: dict[str, Any]):
    """The actor as an NNX module (frozen base + current actor LoRA) for the sampler."""
    return merge_model(graph, frozen, params["actor"])

