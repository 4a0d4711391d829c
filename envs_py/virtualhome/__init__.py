"""VirtualHome text environments (symbolic re-implementation, the originals' specification, docs/envs.md, Part B).

Registered names:
  virtualhome/food_preparation            heat the pancake in the microwave (v1)
  virtualhome/entertainment               chips and milk to the coffee table, TV on, sit on the sofa (v2)
  virtualhome/food_preparation_<variant>  v1 with other words: cheese, hamburger, apple_pie,
                                          pizza, washing_plate, laundry
"""

from envs_py.registry import register
from envs_py.virtualhome.env import FOOD_PREPARATION_VARIANTS, VirtualHomeEnv

_ENTRY = "envs_py.virtualhome.env:VirtualHomeEnv"

register(
    "virtualhome/food_preparation",
    _ENTRY,
    "VirtualHome v1: heat the pancake in the microwave (10 actions, 50-step limit, +1 on success)",
    task="food_preparation",
)
register(
    "virtualhome/entertainment",
    _ENTRY,
    "VirtualHome v2: chips and milk to the coffee table, TV on, sit on the sofa (17 actions, 50-step limit)",
    task="entertainment",
)
for _variant, _words in FOOD_PREPARATION_VARIANTS.items():
    if _variant is None:
        continue
    register(
        f"virtualhome/food_preparation_{_variant}",
        _ENTRY,
        f"VirtualHome v1 generalisation variant: put the {_words.obj} in the {_words.app} "
        "(same dynamics as food_preparation, renamed objects)",
        task="food_preparation",
        variant=_variant,
    )

__all__ = ["VirtualHomeEnv"]
