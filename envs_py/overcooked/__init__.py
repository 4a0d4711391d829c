"""Overcooked text environments with macro actions (the originals' specification, docs/envs.md, Part A).

Registered names:
  overcooked/tomato_salad          serve a bowl of chopped tomato (spec id v4, 5 macro actions)
  overcooked/tomato_lettuce_salad  serve a bowl of chopped tomato and lettuce (spec id v3, 8 macro actions)
"""

from envs_py.registry import register
from envs_py.overcooked.env import OvercookedEnv

_ENTRY = "envs_py.overcooked.env:OvercookedEnv"

register(
    "overcooked/tomato_salad",
    _ENTRY,
    "Overcooked 7x7: chop a tomato and serve it in a bowl (5 macro actions, 200 primitive steps)",
    task="tomato_salad",
)
register(
    "overcooked/tomato_lettuce_salad",
    _ENTRY,
    "Overcooked 7x7: serve a bowl of chopped tomato and lettuce (8 macro actions, 200 primitive steps)",
    task="tomato_lettuce_salad",
)

__all__ = ["OvercookedEnv"]
