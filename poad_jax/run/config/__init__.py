"""The training configuration, one module a job:

- `settings`: `Run`, the config's tree: the layers' declarations composed
  (`LearnerConfig` as `config.ppo`, `SamplingConfig` as `config.sampling`,
  `GroupConfig` as `config.group`, `CriticConfig` as `config.critic`,
  `RolloutConfig`'s and `MethodConfig`'s settings at the top level) beside
  the run's own settings; `default_config()` is made from it.
  The task files `configs/<task>.py` start from it and set what differs;
  `--config.x=y` overrides any field on the command line.  How a setting is
  declared (`setting`, `section`, `inline`, `derived`, the rules `Check`,
  `OneOf`, `at_least`, ...) is `poad_jax/declare.py`.
- `boundary`: `typed(config)`, the config turned back into those objects once,
  each value of its declared type, each derived field by its one rule.
- `checks`: `validate(config)`, the one validation: each declared field's
  check (`CHECKS`), then the checks between fields (`check_row_devices`, the rows
  over the mesh, runs again once the devices resolve a -1 axis).  A bad value raises
  `ConfigError` with one line naming the field; the trainer prints it and
  exits with status 2.  `config_warnings(config)`: valid settings that make
  a run learn nothing, one line each (the trainer prints them).
- `fields`: `field_parent` / `field_value`, the one walker of dotted names
  ("ppo.actor_lr"), with the closest name when one is unknown; `completed`,
  the one filling of a stored config's missing fields with their defaults.
- `files`: `load_config_file` (as `--config=` loads one), a config file's
  per-method presets (`set_method_preset`) and the authors' (`set_authors_semantics`).
- `resumable`: `RESUMABLE_FIELDS`, the fields a run directory's re-run may
  change (and what a change affects), for the trainer and the study runner,
  derived from the declarations (`setting(..., resumable=<kind>)`).
- `convert`: `learner_config`, `rollout_config`, `sampling_config`: one part
  of `typed(config)` with the run's own values (tests and benchmarks);
  `stopping_at`: a typed `RolloutConfig` whose sampler stops at the tokenizer's
  end tokens (`poad_jax.run.build` builds everything else a run needs from
  the typed settings).

Adding a setting is one field in the class that declares its layer's settings,
and its use (docs/architecture.md, "Worked example: adding a setting").

Importing this package imports no JAX (the config files import it).
"""

from poad_jax.run.config.checks import (CHECKS, check_field, check_row_devices, config_warnings,
                                       sampler_logprobs_refusal, validate)
from poad_jax.run.config.convert import group_size, learner_config, rollout_config, sampling_config, stopping_at
from poad_jax.declare import Check, OneOf, above, at_least, derived, inline, setting, section, within
from poad_jax.run.config.errors import ConfigError, TrainError, one_line
from poad_jax.run.config.fields import UnknownFieldError, completed, field_parent, field_value
from poad_jax.run.config.files import (load_config_file, set_authors_semantics, set_method_preset,
                                       split_config_argument)
from poad_jax.run.config.resumable import RESUMABLE_FIELDS, SAME_NUMBERS, resumable_kind
from poad_jax.run.config.settings import DTYPES, MATMUL_DTYPE_CHOICES, MATMUL_DTYPES, Run, default_config
from poad_jax.run.config.boundary import typed

__all__ = [
    "CHECKS", "Check", "ConfigError", "check_row_devices", "DTYPES", "MATMUL_DTYPES", "MATMUL_DTYPE_CHOICES",
    "OneOf",
    "RESUMABLE_FIELDS", "SAME_NUMBERS", "UnknownFieldError", "above", "at_least", "check_field", "completed",
    "config_warnings", "default_config", "derived", "field_parent", "field_value", "group_size", "inline", "learner_config",
    "load_config_file",
    "resumable_kind", "rollout_config", "Run", "sampler_logprobs_refusal", "sampling_config", "section",
    "set_authors_semantics", "set_method_preset", "setting", "split_config_argument", "stopping_at", "TrainError",
    "one_line",
    "typed", "validate", "within",
]
