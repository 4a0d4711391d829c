"""A study: its file, its grid of cells, and each cell's trainer config and command."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import itertools
import pathlib
import re
import sys
from typing import Any, Callable, NamedTuple

import ml_collections
import numpy as np

from poad_jax.run import config as config_lib


REPO = pathlib.Path(__file__).resolve().parents[3]
STUDY_FILE = "study.json"
CELL_FILE = "cell.json"


class StudyError(Exception):
    """A user error in a study file, its grid or its workdir (printed as one line)."""




@dataclasses.dataclass(frozen=True)
class Cell:
    """One run of the grid: its directory name, group label, seed and config overrides.

    `config_argument`: the base config file's argument for this cell (a variant's
    `"config_argument": "twosome"` runs `--config=<base>:twosome`, e.g. a preset
    that holds per-method settings); None for the plain file.
    """

    name: str
    group: tuple[tuple[str, str], ...]  # (axis, value label) for every axis, in axis order
    seed: int
    overrides: dict[str, Any]
    config_argument: str | None = None

    def base_config(self, study: "Study") -> str:
        """The `--config=` value of this cell: the study's base config [with its argument]."""
        return str(study.base_config) + (f":{self.config_argument}" if self.config_argument else "")

    @property
    def group_label(self) -> str:
        return ", ".join(label for _, label in self.group)


@dataclasses.dataclass
class Study:
    name: str
    path: pathlib.Path
    base_config: pathlib.Path
    fixed: dict[str, Any]
    axes: dict[str, list[Any]]
    seeds: tuple[int, ...]
    report: dict[str, Any]  # the `report` options as the study file wrote them (what a workdir records)
    report_options: ReportOptions  # the same, typed and checked once: what the report reads
    # Names under which a pass of this study recorded its cells, from before `--cells` narrowed a pass
    # (a study file that loaded this one and kept some of its cells): such a workdir is this study's.
    former_names: tuple[str, ...] = ()
    # Cells not run because they are the same computation as another cell of the study (e.g. GRPO and
    # GiGPO before any reward): cell name -> the name of the cell whose directory stands for it.
    same_as: dict[str, str] = dataclasses.field(default_factory=dict)

    def identity(self) -> dict[str, Any]:
        """What a workdir records to recognise its study: its name and base config,
        the latter relative to the repository when inside it (a moved clone still matches)."""
        try:
            base = self.base_config.relative_to(REPO).as_posix()
        except ValueError:
            base = str(self.base_config)
        return {"name": self.name, "base_config": base}

    def recorded_in(self, recorded: dict[str, Any] | None) -> bool:
        """True if `recorded` (a workdir's study.json) is this study's, from this or another
        checkout (older workdirs recorded the base config's absolute path), or a former pass's of it
        (`former_names`)."""
        mine, theirs = self.identity(), (recorded or {}).get("identity") or {}
        base = str(theirs.get("base_config", ""))
        return theirs.get("name") in (mine["name"], *self.former_names) and (
            base == mine["base_config"] or base.endswith("/" + mine["base_config"]))


def _plain(value: Any) -> Any:
    """ConfigDicts, tuples and numpy scalars -> JSON-friendly Python values."""
    if isinstance(value, ml_collections.ConfigDict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def load_study(path: str | pathlib.Path) -> Study:
    """Reads and checks a study file; raises StudyError with one line on a mistake."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise StudyError(f"no study file at {path}")
    spec = importlib.util.spec_from_file_location(f"poad_study_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # a broken study file: say where, in one line
        raise StudyError(f"cannot load study file {path}: {type(error).__name__}: {error}") from None
    if not hasattr(module, "get_study"):
        raise StudyError(f"study file {path} defines no get_study()")
    try:
        raw = _plain(module.get_study())
    except Exception as error:
        raise StudyError(f"get_study() in {path} failed: {type(error).__name__}: {error}") from None
    if not isinstance(raw, dict):
        raise StudyError(f"get_study() in {path} must return a dict (or ConfigDict), got {type(raw).__name__}")
    for field in ("name", "base_config", "axes"):
        if field not in raw:
            raise StudyError(f"study file {path}: get_study() has no {field!r}")
    base = pathlib.Path(raw["base_config"])
    if not base.is_absolute():
        candidates = [REPO / base, path.parent / base, pathlib.Path.cwd() / base]
        base = next((c for c in candidates if c.is_file()), candidates[0])
    if not base.is_file():
        raise StudyError(f"study {raw['name']!r}: base config {raw['base_config']} not found")
    axes = _plain(raw["axes"])
    if not isinstance(axes, dict) or not axes:
        raise StudyError(f"study {raw['name']!r}: axes must be a non-empty mapping of axis -> list of values")
    for axis, values in axes.items():
        if not isinstance(values, list) or not values:
            raise StudyError(f"study {raw['name']!r}: axis {axis!r} needs a non-empty list of values")
    seeds = tuple(int(s) for s in _plain(raw.get("seeds", (0,))))
    if not seeds or len(set(seeds)) != len(seeds):
        raise StudyError(f"study {raw['name']!r}: seeds must be distinct and at least one, got {seeds}")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", str(raw["name"])):
        raise StudyError(f"study name {raw['name']!r} may hold only letters, digits, '_', '.', '-'")
    former = raw.get("former_names", ())
    if isinstance(former, str) or not all(isinstance(name, str) for name in former):
        raise StudyError(f"study {raw['name']!r}: former_names must be a list of study names, got {former!r}")
    report = _plain(raw.get("report", {}))
    options = report_options(report, _Where(str(raw["name"]), axes, group_labels(axes)))  # before any cell runs
    study = Study(
        name=str(raw["name"]), path=path.resolve(), base_config=base.resolve(),
        fixed=_plain(raw.get("fixed", {})), axes=axes, seeds=seeds, report=report, report_options=options,
        former_names=tuple(former),
    )
    study.same_as = _same_as(study, _plain(raw.get("same_as", {})))
    return study


def _same_as(study: Study, value: Any) -> dict[str, str]:
    """A study file's `same_as`, checked: {cell name: source} with each key one of the grid's cells and
    each source a cell that runs: another of the grid's (not itself, not one of the keys), or a sibling
    study's cell as "<study>/<cell>" (its workdir beside this one's, e.g. a tuning step's cell that a
    later step's cell repeats); else a one-line StudyError."""
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise StudyError(f"study {study.name!r}: same_as must map cell names to cell names, "
                         f'e.g. {{"GiGPO__seed=1": "GRPO__seed=1"}}, got {value!r}')
    names = {cell.name for cell in grid(study)}
    for cell, source in value.items():
        sibling = _sibling_cell(source)
        for name in (cell,) if sibling else (cell, source):
            if name not in names:
                raise StudyError(f"study {study.name!r}: same_as names {name!r}, which is not one of its cells "
                                 f"(a cell's directory name, such as {next(iter(names))!r})")
        if sibling:
            if not all(map(_is_plain_name, sibling)) or sibling[0] == study.name:
                raise StudyError(f"study {study.name!r}: same_as maps {cell!r} to {source!r}: another study's "
                                 "cell is named <study>/<cell>, e.g. 'group_methods_virtualhome/GRPO__seed=2'")
        elif source == cell or source in value:
            raise StudyError(f"study {study.name!r}: same_as maps {cell!r} to {source!r}, a cell that does not "
                             "run itself: name the cell that runs")
    return dict(value)


def _sibling_cell(source: str) -> tuple[str, str] | None:
    """A `same_as` source "<study>/<cell>" split into (study, cell); None for a cell of this study."""
    if "/" not in source:
        return None
    sibling, _, cell = source.partition("/")
    return sibling, cell


def _is_plain_name(text: str) -> bool:
    """A directory name of its own: not empty, no separator, not "." or ".."."""
    return bool(text) and "/" not in text and text not in (".", "..")


def log_dir(study: Study, workdir: pathlib.Path, cell_name: str) -> pathlib.Path:
    """The directory whose logs are the cell's: its own under `workdir/cells/`, or, for a cell the study
    does not run as the same computation as another (`same_as`), that cell's: in this workdir, or, named
    "<study>/<cell>", in the sibling study's workdir beside it."""
    source = study.same_as.get(cell_name, cell_name)
    sibling = _sibling_cell(source)
    if sibling:
        return workdir.parent / sibling[0] / "cells" / sibling[1]
    return workdir / "cells" / source


def value_label(axis: str, value: Any) -> str:
    if isinstance(value, dict):
        if "label" in value:
            return str(value["label"])
        return " ".join(f"{k}={v}" for k, v in value.items())
    return f"{axis.split('.')[-1]}={value}"


def group_labels(axes: dict[str, list[Any]]) -> tuple[str, ...]:
    """Every group's label (`Cell.group_label`: its value labels joined), in the grid's order."""
    return tuple(", ".join(value_label(axis, value) for axis, value in zip(axes, combination))
                 for combination in itertools.product(*axes.values()))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "-", text).strip("-")


def grid(study: Study) -> list[Cell]:
    """Every cell of the study: axes in order (the last varies fastest), seed innermost."""
    cells = []
    for combination in itertools.product(*study.axes.values()):
        overrides = dict(study.fixed)
        argument = None
        group = []
        for axis, value in zip(study.axes, combination):
            if isinstance(value, dict):
                argument = value.get("config_argument", argument)
                overrides.update({k: v for k, v in value.items() if k not in ("label", "config_argument")})
            else:
                overrides[axis] = value
            group.append((axis, value_label(axis, value)))
        for seed in study.seeds:
            name = "__".join(_slug(label) for _, label in group) + f"__seed={seed}"
            cells.append(Cell(name, tuple(group), seed, {**overrides, "seed": seed}, argument))
    return cells


def group_of(cell_name: str) -> str:
    """A cell directory's group part: its name (`grid`'s) without `__seed=N`."""
    return cell_name.rsplit("__seed=", 1)[0]


def cells_labelled(study: Study, text: str) -> tuple[str, ...]:
    """The names of the cells that `--cells=text` names, in grid order.  `text` is labels separated by
    commas: a cell's directory name (`POAD__seed=0`) names that cell; a group's label (`POAD`; with
    several axes `action_length=8, POAD`, whose comma is read as part of the label) or its directory-name
    prefix (`action_length=8__POAD`) names every cell of the group, and one axis's value label
    (`action_length=8`) every cell with that value.  A label that names nothing is a StudyError
    in one line that lists the study's group labels."""
    cells = grid(study)
    named: dict[str, set[str]] = {}
    for cell in cells:
        prefix = group_of(cell.name)
        for label in (cell.name, cell.group_label, prefix, *(value for _, value in cell.group)):
            named.setdefault(label, set()).add(cell.name)
    pieces, chosen, start = text.split(","), set(), 0
    while start < len(pieces):
        for stop in range(len(pieces), start, -1):  # the longest run of pieces that is a label
            label = ",".join(pieces[start:stop]).strip()
            if label in named:
                chosen |= named[label]
                start = stop
                break
        else:
            label = pieces[start].strip()
            groups = list(dict.fromkeys(cell.group_label for cell in cells))
            raise StudyError(f"--cells {label!r}: study {study.name!r} has the cells of "
                             + "; ".join(repr(group) for group in groups)
                             + f" (a group's label, or one cell's directory name such as {cells[0].name!r})")
    return tuple(cell.name for cell in cells if cell.name in chosen)


# ---------------------------------------------------------------------------
# The study file's report options: one declaration each (type, default, meaning, check), read once.


class _Where(NamedTuple):
    """What an option's check reads of its study: the name (for the message), the axes, the group labels."""

    study: str
    axes: dict[str, list[Any]]
    groups: tuple[str, ...]


def option(default: Any, meaning: str, parse: Callable[[Any, _Where], Any]) -> Any:
    """A `ReportOptions` field: its default, its one-line meaning, and `parse(value, where)`, which
    returns the typed value of what a study file wrote or raises a one-line StudyError."""
    return dataclasses.field(default=default, metadata={"meaning": meaning, "parse": parse})


def _refuse(where: _Where, name: str, usage: str, value: Any) -> StudyError:
    """The one-line StudyError of a malformed option `name`."""
    return StudyError(f"study {where.study!r}: report option {name} must be {usage}, got {value!r}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _metric(value: Any, where: _Where) -> str:
    """A record field's name."""
    if not isinstance(value, str) or not value:
        raise _refuse(where, "metric", "the name of a field the cells log (a string)", value)
    return value


def _smoothing(value: Any, where: _Where) -> int:
    """A window of at least one update."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise _refuse(where, "smoothing", "a whole number of updates >= 1", value)
    return value


def _final_fraction(value: Any, where: _Where) -> float:
    """A fraction in (0, 1]."""
    if not _is_number(value) or not 0 < value <= 1:
        raise _refuse(where, "final_fraction", "a fraction of the env steps in (0, 1]", value)
    return float(value)


def _threshold(value: Any, where: _Where) -> float:
    """A level of the metric, as written (the report's header shows it so)."""
    if not _is_number(value):
        raise _refuse(where, "threshold", "a number (a level of the metric)", value)
    return value


def _theory(value: Any, where: _Where) -> str | None:
    """"module:function" (`report._theory_fn` imports it), or None for a false value."""
    if not value:
        return None
    if not isinstance(value, str) or not re.fullmatch(r"[\w.]+:\w+", value):
        raise _refuse(where, "theory", '"module:function"', value)
    return value


def _axis(name: str, value: Any, where: _Where) -> str:
    """`value`, one of the study's axes."""
    if value not in where.axes:
        raise _refuse(where, name, "one of the study's axes (" + ", ".join(map(repr, where.axes)) + ")", value)
    return value


def _facet(value: Any, where: _Where) -> str | None:
    """An axis of the study, or None for a false value."""
    return _axis("facet", value, where) if value else None


def _heatmap(value: Any, where: _Where) -> tuple[str, str] | None:
    """Two distinct axes of the study (rows, columns), or None for a false value."""
    if not value:
        return None
    if not isinstance(value, (list, tuple)) or len(value) != 2 or value[0] == value[1]:
        raise _refuse(where, "heatmap", "(row axis, column axis), two axes of the study", value)
    return _axis("heatmap", value[0], where), _axis("heatmap", value[1], where)


@dataclasses.dataclass(frozen=True)
class StepNames:
    """Report option `steps`: what a cell's succeeded steps and their reward are called."""

    succeeded: str = "succeeded"
    reward: str = "reward"


def _steps(value: Any, where: _Where) -> StepNames | None:
    """`{"succeeded": name, "reward": name}` (either may be left out), or None for a false value."""
    if not value:
        return None
    if (not isinstance(value, dict) or set(value) - {"succeeded", "reward"}
            or not all(isinstance(name, str) and name for name in value.values())):
        raise _refuse(where, "steps", '{"succeeded": "<name>", "reward": "<name>"}', value)
    return StepNames(**value)


@dataclasses.dataclass(frozen=True)
class Reference:
    """Report option `reference`: published numbers by group label, as (low, high) ranges (no label and
    no values: none)."""

    label: str
    values: dict[str, tuple[float, float]]


def _known_groups(where: _Where, name: str, labels: Any) -> None:
    """Raises the one-line StudyError of report option `name` when `labels` name a group the study lacks."""
    unknown = sorted(set(labels) - set(where.groups))
    if unknown:
        raise StudyError(f"study {where.study!r}: report option {name} names no group {unknown}; its groups: "
                         + ", ".join(sorted(where.groups)))


def _reference(value: Any, where: _Where) -> Reference:
    """`{"label": text, "values": {group label: x or (low, high)}}`, naming groups of the study; none
    (`NO_REFERENCE`) for a false value."""
    if not value:
        return NO_REFERENCE
    if not isinstance(value, dict) or not isinstance(value.get("values"), dict) or not value.get("label"):
        raise StudyError(f"study {where.study!r}: report option reference must be "
                         '{"label": "...", "values": {"<group label>": x or (low, high)}}')
    ranges = {}
    for group, number in value["values"].items():
        pair = number if isinstance(number, (list, tuple)) else (number, number)
        try:
            low, high = (float(v) for v in pair)
        except (TypeError, ValueError):
            raise StudyError(f"study {where.study!r}: reference value for {group!r} must be a number or a "
                             f"(low, high) pair, not {number!r}") from None
        ranges[str(group)] = (min(low, high), max(low, high))
    _known_groups(where, "reference", ranges)
    return Reference(str(value["label"]), ranges)


NO_REFERENCE = Reference("", {})


@dataclasses.dataclass(frozen=True)
class BestPrograms:
    """Report option `best_programs` (DataSciCoding): whether the report runs each cell's best program
    again, and published AUCs by label to set beside them (e.g. the paper's Table 4)."""

    rescore: bool = False
    reference: dict[str, float] = dataclasses.field(default_factory=dict)
    # A program whose second re-score differs from its first (its own randomness) is scored this many times
    # in all and reported by the mean; 1: once.
    repeats: int = 1


def _best_programs(value: Any, where: _Where) -> BestPrograms:
    """`{"rescore": bool, "repeats": int, "reference": {label: AUC}}` (any may be left out); the defaults (no
    rescoring, once, no reference) for a false value."""
    if not value:
        return BestPrograms()
    usage = ('report option best_programs must be {"rescore": True or False, "repeats": <int >= 1>, '
             '"reference": {"<label>": AUC}}')
    if not isinstance(value, dict) or set(value) - {"rescore", "reference", "repeats"}:
        raise StudyError(f"study {where.study!r}: {usage}")
    rescore, reference, repeats = value.get("rescore", False), value.get("reference", {}), value.get("repeats", 1)
    if (not isinstance(rescore, bool) or not isinstance(reference, dict) or isinstance(repeats, bool)
            or not isinstance(repeats, int) or repeats < 1):
        raise StudyError(f"study {where.study!r}: {usage}")
    numbers = {}
    for label, number in reference.items():
        try:
            numbers[str(label)] = float(number)
        except (TypeError, ValueError):
            raise StudyError(f"study {where.study!r}: best_programs reference {label!r} must be a number, "
                             f"not {number!r}") from None
    return BestPrograms(rescore, numbers, repeats)


@dataclasses.dataclass(frozen=True)
class SuccessSpeed:
    """Report option `success_speed`: the success rate, over a window of episodes, whose first env step
    the learning-speed table gives."""

    rate: float = 0.5
    episodes: int = 16


def _success_speed(value: Any, where: _Where) -> SuccessSpeed | None:
    """True (the defaults) or `{"rate": r in (0, 1], "episodes": n >= 1}`, or None for a false value."""
    if not value:
        return None
    value = {} if value is True else value
    usage = 'report option success_speed must be True or {"rate": r in (0, 1], "episodes": n >= 1}'
    if not isinstance(value, dict) or set(value) - {"rate", "episodes"}:
        raise StudyError(f"study {where.study!r}: {usage}")
    rate, episodes = value.get("rate", SuccessSpeed.rate), value.get("episodes", SuccessSpeed.episodes)
    if not _is_number(rate) or not 0 < rate <= 1 or isinstance(episodes, bool) or not isinstance(episodes, int) \
            or episodes < 1:
        raise StudyError(f"study {where.study!r}: {usage}, got {value!r}")
    return SuccessSpeed(float(rate), episodes)


def _pairs(value: Any, where: _Where) -> tuple[tuple[str, str], ...]:
    """Pairs of two distinct group labels of the study, or () for a false value."""
    if not value:
        return ()
    usage = 'a list of (group label, group label) pairs, e.g. [("POAD", "NTPO")]'
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(x, str) for x in pair)
            and pair[0] != pair[1] for pair in value):
        raise _refuse(where, "pairs", usage, value)
    _known_groups(where, "pairs", {label for pair in value for label in pair})
    return tuple((a, b) for a, b in value)


@dataclasses.dataclass(frozen=True)
class ReportOptions:
    """A study file's `report` options, each declared once: its type, default, meaning and check
    (`option`); `load_study` reads them once (`report_options`), and the report reads these fields."""

    metric: str = option("episode_return", "the logged field the groups are compared on", _metric)
    smoothing: int = option(1, "the moving average's window, in updates, of the curves and the threshold",
                            _smoothing)
    final_fraction: float = option(0.1, "final = the mean over the updates in this last fraction of env steps",
                                   _final_fraction)
    threshold: float | None = option(None, "a level of the metric: env steps until its moving average reaches it",
                                     _threshold)
    theory: str | None = option(None, '"module:function", the optimum under the method\'s discount, per cell config',
                                _theory)
    facet: str | None = option(None, "an axis: the return and success figures get one panel per value", _facet)
    heatmap: tuple[str, str] | None = option(None, "(row axis, column axis): a heatmap of the final return",
                                             _heatmap)
    steps: StepNames | None = option(None, "names of succeeded steps and their reward: a per-step table and figure",
                                     _steps)
    reference: Reference = option(NO_REFERENCE, "published numbers by group, beside the study's own", _reference)
    best_programs: BestPrograms = option(BestPrograms(), "DataSciCoding's best programs: rescored, and references",
                                         _best_programs)
    success_speed: SuccessSpeed | None = option(None, "env steps to a success rate over a window of episodes",
                                                _success_speed)
    pairs: tuple[tuple[str, str], ...] = option((), "pairs of groups: Welch's t-test on their final metric per seed",
                                                _pairs)


def report_options(raw: dict[str, Any], where: _Where) -> ReportOptions:
    """The typed `ReportOptions` of a study file's `report` dict: each option checked by its `parse`;
    None leaves an option at its default.  An unknown option or a malformed one is a one-line StudyError
    naming it."""
    if not isinstance(raw, dict):
        raise StudyError(f"study {where.study!r}: report must be a mapping of option -> value, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(ReportOptions)}
    unknown = [name for name in raw if name not in fields]
    if unknown:
        raise StudyError(f"study {where.study!r}: unknown report option {unknown[0]!r}; the options are "
                         + ", ".join(fields))
    return ReportOptions(**{name: fields[name].metadata["parse"](value, where)
                            for name, value in raw.items() if value is not None})


def _set_field(config: ml_collections.ConfigDict, field: str, value: Any) -> None:
    """config.<field> = value for a dotted field; StudyError (with a hint) if it does not exist."""
    try:
        node, last = config_lib.field_parent(config, field)
    except config_lib.UnknownFieldError as error:
        hint = f" (did you mean {error.suggestion!r}?)" if error.suggestion else ""
        raise StudyError(f"unknown config field {field!r}: {error.parent or 'the config'} has no "
                         f"{error.missing!r}{hint}") from None
    try:
        node[last] = value
    except (TypeError, ValueError) as error:
        raise StudyError(f"cannot set {field}={value!r}: {error}") from None


def cell_config(study: Study, cell: Cell) -> ml_collections.ConfigDict:
    """The base config with the cell's overrides applied (checked by the trainer's validation)."""
    base = config_lib.load_config_file(cell.base_config(study))
    config = copy.deepcopy(base)
    for field, value in cell.overrides.items():
        _set_field(config, field, value)
    try:
        config_lib.validate(config)
    except config_lib.ConfigError as error:
        raise StudyError(f"cell {cell.name}: {error}") from None
    return config


def _flag_value(value: Any) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(_flag_value(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return str(value)


def train_command(study: Study, cell: Cell, cell_dir: pathlib.Path) -> list[str]:
    """The `python -m poad_jax.train` command line that runs (or resumes) one cell."""
    args = [sys.executable, "-m", "poad_jax.train", f"--config={cell.base_config(study)}", f"--workdir={cell_dir}"]
    args += [f"--config.{field}={_flag_value(value)}" for field, value in cell.overrides.items()]
    return args


