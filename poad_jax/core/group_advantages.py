"""Group-relative advantages: GRPO's episode level and GiGPO's episode + step ("anchor state") level.

Critic-free credit for the step rows of a batch.  A row is one env step of one
trajectory: its episode group (trajectories started from the same state), its
trajectory, its step index ``t``, the observation the action was taken from
and the env reward.  Every row gets one advantage, which the learner gives to
every token of that row's action.  The functions are host-side NumPy in
float64 (see "Precision" below); the grouping reads observation text, and the
advantages do not depend on the parameters, so they are computed once per
batch, before the compiled update.

Notation.  Rows ``i``; ``g(i)`` the episode group, ``tau(i)`` the trajectory,
``s(i)`` the step group (anchor state) of row ``i``::

    R_i   = sum_{j in tau(i)} r_j                               (episode return, undiscounted)
    G_i   = sum_{j in tau(i), k_j >= k_i} gamma^(k_j - k_i) r_j  (discounted return-to-go)
    A^E_i = (R_i - mean_{j in g(i)} R_j) / F                     (episode level; GRPO)
    A^S_i = (G_i - mean_{j in s(i)} G_j) / F                     (step level)
    A_i   = A^E_i + omega A^S_i                                  (GiGPO)

with ``k_i`` the position of row ``i`` among its trajectory's rows (by ``t``),
``F = 1`` in mode ``mean_norm`` and ``F = std + epsilon`` in ``mean_std_norm``.

The reference is verl-agent's ``gigpo/core_gigpo.py`` (GiGPO, Feng et al.
2025); verl-agent's GRPO (``compute_grpo_outcome_advantage``) is the same rule
as the episode level.  Where the code and the paper's equations differ, these
functions follow the code (docs/group_methods.md has each difference and the
parity command):

1. The episode statistics are taken over the group's step ROWS, not its
   trajectories: a trajectory of n steps puts its ``R`` into its group's mean
   and std n times.
2. An episode group of one row gets mean 0 and std 1 (``A^E = R`` or
   ``R / (1 + epsilon)``), not 0; a group of one trajectory with several
   rows gets 0 like any group whose returns are all equal.
3. A step group of one row gets its own value as the mean and std 1, so
   ``A^S = 0`` in both modes.
4. ``std`` is the unbiased one (Bessel's correction, ``n - 1``; torch.std's
   default), and the division is by ``std + epsilon``.
5. ``R`` is undiscounted (the rollout's sum of rewards) while ``G`` is
   discounted; ``G`` stops at the trajectory's last row (no bootstrap), and
   its exponent counts the trajectory's rows, equal to the difference of
   ``t`` when a trajectory's steps are contiguous.
6. Step groups never cross episode groups.  With a similarity threshold
   below 1 they are formed greedily in row order (`step_group_ids`), so they
   depend on the rows' order and are not transitive.
7. One mode serves both levels.

Precision.  The reference computes in float32, where torch's mean of equal
returns is often an ulp off and ``mean_std_norm`` divides that by a std of
the same size plus epsilon (seven equal step returns of 0.7 get 0.056 each).
Here the arithmetic is float64 and the deviations are centred twice
(`group_statistics`), so equal returns give exactly 0.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Literal, NamedTuple, Sequence

import numpy as np

from poad_jax.declare import above, at_least, hold_to_declarations, setting, within

GroupNormalisation = Literal["mean_norm", "mean_std_norm"]
NORMALISATIONS: tuple[str, ...] = ("mean_norm", "mean_std_norm")


@dataclasses.dataclass(frozen=True)
class GroupConfig:
    """GRPO's and GiGPO's settings (`config.group`), declared once beside the functions that read
    them (`poad_jax.declare`; `run.config.typed(config).group`)."""

    size: int = setting(0, "trajectories per episode group, started from one reset seed; 0: all num_threads",
                        at_least(0, "0 puts all the update's threads in one group"))
    mode: GroupNormalisation = setting(
        "mean_std_norm", "mean_std_norm: (x - mean) / (std + epsilon) within a group; mean_norm: x - mean")
    epsilon: float = setting(1e-6, "added to a group's std", above(0))
    omega: float = setting(1.0, "gigpo: the weight of the step-level (anchor state) advantage", at_least(0))
    similarity: float = setting(
        1.0, "gigpo: observations whose difflib ratio reaches it share an anchor state; 1: identical text only",
        within(0, 1, open_low=True))

    def __post_init__(self):
        hold_to_declarations(self)

    def group_size(self, num_threads: int) -> int:
        """Trajectories per group in a run of `num_threads` threads: `size`, or all of them for 0 (the one
        rule: the rollouts' `group_size` and `agent.methods.GroupRelative.size` are this)."""
        return self.size or num_threads


class GroupAdvantageError(ValueError):
    """A bad argument to a group advantage (one line)."""


class GroupAdvantages(NamedTuple):
    """GiGPO's advantages of the N step rows, each ``[N]`` float64."""

    episode_adv: np.ndarray  # A^E
    step_adv: np.ndarray  # A^S
    adv: np.ndarray  # A^E + omega A^S


def _rows(*arrays: np.ndarray) -> None:
    """Every array one-dimensional, all of one length (GroupAdvantageError otherwise; plain NumPy, so
    that the config, which names `GroupNormalisation`, loads without JAX)."""
    shapes = [np.shape(a) for a in arrays]
    if any(len(shape) != 1 for shape in shapes) or len(set(shapes)) > 1:
        raise GroupAdvantageError(f"the step rows' arrays must be one-dimensional and of one length, got shapes {shapes}")


def check_normalisation(mode: str, epsilon: float) -> None:
    """Raise `GroupAdvantageError` for an unknown mode, or a negative epsilon (zero with
    ``mean_std_norm``, where a group of equal values would divide 0 by 0)."""
    if mode not in NORMALISATIONS:
        raise GroupAdvantageError(f"mode must be one of {', '.join(NORMALISATIONS)}, got {mode!r}")
    if not epsilon >= 0.0 or (mode == "mean_std_norm" and epsilon == 0.0):
        raise GroupAdvantageError(f"epsilon must be > 0 with mode mean_std_norm (>= 0 otherwise), got {epsilon}")


def dense_ids(*keys: Sequence) -> np.ndarray:
    """``[N]`` int64: one id per distinct tuple ``(keys[0][i], keys[1][i], ...)``, numbered
    0, 1, ... in order of first appearance; rows with equal tuples share their id."""
    if not keys:
        raise GroupAdvantageError("dense_ids needs at least one key array")
    lengths = {len(key) for key in keys}
    if len(lengths) != 1:
        raise GroupAdvantageError(f"key arrays differ in length: {sorted(lengths)}")
    table: dict[tuple, int] = {}
    return np.asarray([table.setdefault(key, len(table)) for key in zip(*(np.asarray(k).tolist() for k in keys))],
                      np.int64)


def trajectory_positions(traj: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``[N]`` int64 ``k_i``: the position of row ``i`` among its trajectory's rows ordered by ``t``
    (0 for each trajectory's first step).  `GroupAdvantageError` for two rows of one trajectory
    with the same ``t``."""
    traj, t = np.asarray(traj), np.asarray(t)
    _rows(traj, t)
    order = np.lexsort((t, traj))
    sorted_traj, sorted_t = traj[order], t[order]
    same = sorted_traj[1:] == sorted_traj[:-1]
    repeated = same & (sorted_t[1:] == sorted_t[:-1])
    if np.any(repeated):
        k = int(np.argmax(repeated))
        raise GroupAdvantageError(f"trajectory {sorted_traj[k]} has two rows with t = {sorted_t[k]}")
    starts = np.concatenate([[True], ~same])
    first = np.maximum.accumulate(np.where(starts, np.arange(len(order)), 0))
    positions = np.empty(len(order), np.int64)
    positions[order] = np.arange(len(order)) - first
    return positions


def episode_returns(reward: np.ndarray, traj: np.ndarray) -> np.ndarray:
    """``[N]`` float64 ``R_i = sum_{j in tau(i)} r_j``: each row's trajectory's undiscounted return."""
    reward = np.asarray(reward, np.float64)
    _rows(reward, np.asarray(traj))
    ids = dense_ids(traj)
    return np.bincount(ids, weights=reward)[ids]


def discounted_returns(reward: np.ndarray, traj: np.ndarray, t: np.ndarray, gamma: float) -> np.ndarray:
    """``[N]`` float64 return-to-go of each row inside its trajectory, no bootstrap::

        G_i = r_i + gamma G_next(i)      (G_next = 0 after the trajectory's last row)

    ``next(i)`` is the row of the same trajectory with the next larger ``t``, so
    the exponent counts rows, not differences of ``t``.
    """
    reward = np.asarray(reward, np.float64)
    traj, t = np.asarray(traj), np.asarray(t)
    _rows(reward, traj, t)
    if not 0.0 <= gamma <= 1.0:
        raise GroupAdvantageError(f"gamma must be in [0, 1], got {gamma}")
    trajectory_positions(traj, t)  # checks t
    order = np.lexsort((t, traj))
    returns = np.zeros(len(order), np.float64)
    following = 0.0
    for n in range(len(order) - 1, -1, -1):
        row = order[n]
        continues = n + 1 < len(order) and traj[order[n + 1]] == traj[row]
        following = reward[row] + (gamma * following if continues else 0.0)
        returns[row] = following
    return returns


def group_statistics(values: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(count, mean, std)``, each ``[N]``: the statistics of row ``i``'s group ``{j : ids_j = ids_i}``::

        mean = sum_j x_j / n
        std  = sqrt(sum_j (x_j - mean)^2 / (n - 1))      (unbiased; 0 when n = 1)

    The centred values are taken twice (``x - m0``, then minus their own mean),
    so a group of equal values has exactly zero deviations and std.
    """
    values = np.asarray(values, np.float64)
    _rows(values, np.asarray(ids))
    dense = dense_ids(ids)
    count = np.bincount(dense).astype(np.float64)
    first_mean = np.bincount(dense, weights=values) / count
    shifted = values - first_mean[dense]
    correction = np.bincount(dense, weights=shifted) / count
    centred = shifted - correction[dense]
    variance = np.bincount(dense, weights=np.square(centred)) / np.maximum(count - 1.0, 1.0)
    return count[dense], (first_mean + correction)[dense], np.sqrt(variance)[dense]


def normalise(values: np.ndarray, mean: np.ndarray, std: np.ndarray, mode: GroupNormalisation,
              epsilon: float) -> np.ndarray:
    """``[N]`` float64::

        mean_norm:      x - mean
        mean_std_norm:  (x - mean) / (std + epsilon)
    """
    check_normalisation(mode, epsilon)
    centred = np.asarray(values, np.float64) - np.asarray(mean, np.float64)
    if mode == "mean_norm":
        return centred
    return centred / (np.asarray(std, np.float64) + epsilon)


def episode_advantages(episode_return: np.ndarray, group: np.ndarray, mode: GroupNormalisation = "mean_std_norm",
                       epsilon: float = 1e-6) -> np.ndarray:
    """``[N]`` float64 episode-level advantage of each row (GRPO's advantage)::

        A^E_i = normalise(R_i; mean, std over the ROWS j of group g(i))
        a group of one row: mean = 0, std = 1

    so a trajectory's return counts once per step row in its group's
    statistics, and a lone row keeps ``R`` (``mean_norm``) or
    ``R / (1 + epsilon)``.
    """
    episode_return = np.asarray(episode_return, np.float64)
    _rows(episode_return, np.asarray(group))
    count, mean, std = group_statistics(episode_return, group)
    alone = count == 1
    return normalise(episode_return, np.where(alone, 0.0, mean), np.where(alone, 1.0, std), mode, epsilon)


def step_advantages(step_return: np.ndarray, step_group: np.ndarray, mode: GroupNormalisation = "mean_std_norm",
                    epsilon: float = 1e-6) -> np.ndarray:
    """``[N]`` float64 step-level advantage of each row::

        A^S_i = normalise(G_i; mean, std over the rows of step group s(i))
        a group of one row: mean = G_i, std = 1, so A^S_i = 0
    """
    step_return = np.asarray(step_return, np.float64)
    _rows(step_return, np.asarray(step_group))
    count, mean, std = group_statistics(step_return, step_group)
    return normalise(step_return, mean, np.where(count == 1, 1.0, std), mode, epsilon)


def similar(a: str, b: str, threshold: float) -> bool:
    """``difflib.SequenceMatcher(None, a, b).ratio() >= threshold`` (the ratio depends on the
    order of ``a`` and ``b`` in general: ``a`` is the new row's text, ``b`` a group's first)."""
    return difflib.SequenceMatcher(None, a, b).ratio() >= threshold


def step_group_ids(group: np.ndarray, obs: Sequence[str], similarity: float = 1.0) -> np.ndarray:
    """``[N]`` int64 anchor-state groups: rows of one episode group whose observations are the
    same text (``similarity = 1``) or similar (``0 < similarity < 1``).

    Similar: within each episode group, in row order, a row joins the first
    step group whose first row's text ``b`` has ``similar(obs_i, b, similarity)``,
    else it starts a new step group.  Ids are numbered in order of first
    appearance.
    """
    group = np.asarray(group)
    obs = np.asarray(obs)
    _rows(group, obs)
    if not 0.0 < similarity <= 1.0:
        raise GroupAdvantageError(f"similarity must be in (0, 1], got {similarity}")
    texts = [str(text) for text in obs.tolist()]
    if similarity == 1.0:
        return dense_ids(group, texts)
    representatives: dict[object, list[tuple[str, int]]] = {}
    out = np.empty(len(texts), np.int64)
    count = 0
    for i, (g, text) in enumerate(zip(group.tolist(), texts)):
        clusters = representatives.setdefault(g, [])
        for first_text, cluster in clusters:
            if similar(text, first_text, similarity):
                out[i] = cluster
                break
        else:
            clusters.append((text, count))
            out[i] = count
            count += 1
    return out


def check_rows(group: np.ndarray, traj: np.ndarray, t: np.ndarray) -> None:
    """`GroupAdvantageError` unless every trajectory lies in one episode group with distinct ``t``."""
    group, traj, t = np.asarray(group), np.asarray(traj), np.asarray(t)
    _rows(group, traj, t)
    ids = dense_ids(traj)
    first_group = group[np.unique(ids, return_index=True)[1]]  # the group of each trajectory's first row
    spread = first_group[ids] != group
    if np.any(spread):
        i = int(np.argmax(spread))
        raise GroupAdvantageError(
            f"trajectory {traj[i]} has rows in episode groups {first_group[ids[i]]} and {group[i]}")
    trajectory_positions(traj, t)


def grpo_advantages(reward: np.ndarray, group: np.ndarray, traj: np.ndarray,
                    mode: GroupNormalisation = "mean_std_norm", epsilon: float = 1e-6) -> np.ndarray:
    """``[N]`` float64 GRPO advantage of each step row: ``A^E_i`` of its trajectory's return
    ``R_i`` (`episode_advantages`).  verl-agent's default mode for GRPO is ``mean_std_norm``."""
    group, traj = np.asarray(group), np.asarray(traj)
    _rows(np.asarray(reward), group, traj)
    return episode_advantages(episode_returns(reward, traj), group, mode, epsilon)


def gigpo_advantages(reward: np.ndarray, group: np.ndarray, traj: np.ndarray, t: np.ndarray,
                     step_group: np.ndarray, *, gamma: float, omega: float = 1.0, epsilon: float = 1e-6,
                     mode: GroupNormalisation = "mean_norm") -> GroupAdvantages:
    """GiGPO's advantages of the N step rows::

        A_i = A^E_i + omega A^S_i
        A^E_i = episode_advantages(R_i)       R_i = episode_returns(r)
        A^S_i = step_advantages(G_i)          G_i = discounted_returns(r, gamma)

    ``step_group`` from `step_group_ids`.  Both levels use one mode;
    verl-agent's default is ``mean_norm``, its example scripts use
    ``mean_std_norm``.

    Args:
      reward: ``[N]`` env reward of each step.
      group: ``[N]`` int episode group.
      traj: ``[N]`` int trajectory (one episode group each).
      t: ``[N]`` int step index in its trajectory (distinct within a trajectory).
      step_group: ``[N]`` int anchor-state group.
      gamma: discount of the step-level return.
      omega: weight of the step level.
      epsilon: added to the std (``mean_std_norm``).
      mode: ``mean_norm`` or ``mean_std_norm``.
    Returns:
      `GroupAdvantages` (``episode_adv``, ``step_adv``, ``adv``), each ``[N]`` float64.
    """
    reward = np.asarray(reward, np.float64)
    _rows(reward, np.asarray(group), np.asarray(traj), np.asarray(t), np.asarray(step_group))
    check_normalisation(mode, epsilon)
    check_rows(group, traj, t)
    episode = episode_advantages(episode_returns(reward, traj), group, mode, epsilon)
    step = step_advantages(discounted_returns(reward, traj, t, gamma), step_group, mode, epsilon)
    return GroupAdvantages(episode, step, episode + omega * step)


def gigpo_from_observations(reward: np.ndarray, group: np.ndarray, traj: np.ndarray, t: np.ndarray,
                            obs: Sequence[str], *, gamma: float, omega: float = 1.0, epsilon: float = 1e-6,
                            mode: GroupNormalisation = "mean_norm", similarity: float = 1.0) -> GroupAdvantages:
    """`gigpo_advantages` with the anchor-state groups formed from the observation text
    (`step_group_ids`, ``similarity = 1``: identical text only)."""
    return gigpo_advantages(reward, group, traj, t, step_group_ids(group, obs, similarity), gamma=gamma,
                            omega=omega, epsilon=epsilon, mode=mode)
