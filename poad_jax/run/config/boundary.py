"""The config turned back into the layers' typed objects, once, at the command-line boundary.

`typed(config)` is the `settings.Run` tree of a (checked) config: each setting
as its declared type (`declare.as_value`: an int where a float is declared
becomes a float, a JSON list a tuple), each section the dataclass that declares
it (`typed(config).ppo` is the learner's `LearnerConfig`, `.sampling` the
sampler's `SamplingConfig`, `.rollout` the rollouts' `RolloutConfig`, ...).
A declaration's derived fields are set here, each by one rule of `DERIVED`
(a field with a default and no rule keeps its default; the run sets it, e.g.
`SamplingConfig.stop_token_ids` from its tokenizer).  Below `run/` nothing
reads a ConfigDict: the library takes these objects.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import ml_collections

from poad_jax.agent.learner_config import LearnerConfig
from poad_jax.agent.rollout_config import RolloutConfig
from poad_jax.core import layout  # NumPy only
from poad_jax.core.group_advantages import GroupConfig
from poad_jax.declare import as_value, declared_leaves, typed_tree
from poad_jax.run.config.fields import completed, field_value
from poad_jax.run.config.settings import Run
from poad_jax.sampling.config import SamplingConfig

_KINDS = {leaf.dotted: leaf.kind for leaf in declared_leaves(Run)}


class _Source:
    """A checked config's values as their declared types, for the derived fields' rules."""

    def __init__(self, config: ml_collections.ConfigDict):
        self.config = config

    def value(self, dotted: str) -> Any:
        return as_value(_KINDS[dotted], field_value(self.config, dotted))

    def section(self, name: str, cls: type) -> Any:
        return typed_tree(cls, self.config[name], self.derive, f"{name}.")

    def derive(self, cls: type, name: str, built: dict) -> Any:
        rule = DERIVED.get((cls, name))
        if rule is None:
            field = next(f for f in dataclasses.fields(cls) if f.name == name)
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise TypeError(f"{cls.__name__}.{name} is derived but run/config/boundary.py has no rule for it")
            return dataclasses.MISSING
        return rule(self)


def group_size_rule(source: _Source) -> int:
    """The group-relative methods' trajectories per group (`GroupConfig.group_size`: `group.size`, 0
    there all `num_threads`); 0 for the other methods, whose threads' episodes go on across updates."""
    from poad_jax.agent.methods import GROUP_METHODS

    if source.value("method") not in GROUP_METHODS:
        return 0
    return source.section("group", GroupConfig).group_size(source.value("num_threads"))


# (declaring class, derived field) -> its value from the config's other settings.
DERIVED: dict[tuple[type, str], Callable[[_Source], Any]] = {
    (LearnerConfig, "temperature"): lambda s: s.value("sampling.temperature"),
    (LearnerConfig, "critic_kind"): lambda s: s.value("critic.kind"),
    (SamplingConfig, "logprobs_of"): lambda s: "policy" if s.value("behaviour_logprobs") == "sampler" else "sampled",
    (RolloutConfig, "sampling"): lambda s: s.section("sampling", SamplingConfig),
    (RolloutConfig, "pack_behaviour"): lambda s: s.value("ppo.behaviour_correction") != "none",
    (RolloutConfig, "group_size"): group_size_rule,
    (RolloutConfig, "prompt_buckets"): lambda s: layout.prompt_buckets(s.value("prompt_bucket_step")),
}


def typed(config: ml_collections.ConfigDict) -> Run:
    """The typed `Run` tree of `config` (a stored config missing newer fields is completed first)."""
    source = _Source(completed(config))
    return typed_tree(Run, source.config, source.derive)
