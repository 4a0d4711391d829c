"""Text layer of Overcooked: action labels and prompts from the observation vector (A.11).

Everything here reads the A.7 observation only, so items outside the agent's
5x5 view are unknown to the text, exactly as in the original text layer.
The wording is ours; the content and the labels follow the specification.
"""

from __future__ import annotations

import functools
import typing

from envs_py.overcooked import tasks as T

BOARD_ORDINALS = ("first", "second")
FRONT_OF_BOARD = ((1, 1), (2, 1))  # cells described as "in front of" board 1 / board 2
NEXT_STEP = "Your next step is to"


class ObservedItem(typing.NamedTuple):
    name: str  # food name or "plate"
    pos: tuple[int, int]
    chopped: bool


def _display(name: str) -> str:
    return "bowl" if name == "plate" else name


def observed_items(obs: typing.Sequence[int], task: T.KitchenTask) -> tuple[list[ObservedItem], tuple[int, int]]:
    """Foods and plate as observed (hidden ones at (0, 0)), and the agent's cell."""
    items = []
    i = 0
    for food in task.foods:
        items.append(ObservedItem(food, (obs[i], obs[i + 1]), obs[i + 2] == T.CHOPS_TO_FINISH))
        i += 3
    items.append(ObservedItem("plate", (obs[i], obs[i + 1]), False))
    i += 2 + 2 * len(task.knives) + 2
    return items, (obs[i], obs[i + 1])


def _at(items: list[ObservedItem], cell: tuple[int, int]) -> list[ObservedItem]:
    return [item for item in items if item.pos == cell]


@functools.lru_cache(maxsize=None)
def action_labels(obs: tuple[int, ...], task: T.KitchenTask) -> tuple[str, ...]:
    """One label per macro action (index = macro id) for observation `obs`."""
    items, agent = observed_items(obs, task)
    in_hand = _at(items, agent)
    boards = [_at(items, cell) for cell in task.knives]
    if task.key == "v4":
        return _tomato_salad_labels(in_hand, boards[0], agent)
    return _lettuce_tomato_labels(in_hand, boards, agent, task)


def _tomato_salad_labels(in_hand, on_board, agent) -> tuple[str, ...]:
    labels = ["pick up the tomato", "take the bowl", "walk to the cutting board", "serve nothing", "chop nothing"]
    if len(on_board) == 1 and on_board[0].name == "tomato" and agent == FRONT_OF_BOARD[0]:
        labels[4] = "chop the tomato"
    if len(in_hand) == 1:
        labels[3] = "serve the dish"
        held = in_hand[0]
        if held.name == "plate":
            labels[0] = "put the tomato in the bowl"
            labels[2] = "put the bowl on the cutting board"
        elif not held.chopped:
            labels[2] = "put the tomato on the cutting board"
    elif len(in_hand) >= 2:
        labels[3] = "serve the dish"
        labels[0] = "put the tomato in the bowl"
        labels[2] = "put the bowl on the cutting board"
    return tuple(labels)


def _lettuce_tomato_labels(in_hand, boards, agent, task) -> tuple[str, ...]:
    labels = [
        "pick up the tomato", "pick up the lettuce", "pick up the onion", "take the empty bowl",
        "walk to the first cutting board", "walk to the second cutting board", "serve nothing", "chop nothing",
    ]
    if any(len(group) >= 2 for group in (in_hand, *boards)):
        labels[3] = "take the bowl"
    for b, on_board in enumerate(boards):
        if len(on_board) == 1 and on_board[0].name != "plate" and agent == FRONT_OF_BOARD[b]:
            labels[7] = f"chop the {on_board[0].name}"
    holds_plate = len(in_hand) >= 2 or (len(in_hand) == 1 and in_hand[0].name == "plate")
    if in_hand:
        labels[6] = "serve the dish"
    if holds_plate:
        for f, food in enumerate(task.foods):
            labels[f] = f"put the {food} in the bowl"
        labels[4] = "put the bowl on the first cutting board"
        labels[5] = "put the bowl on the second cutting board"
    elif len(in_hand) == 1 and not in_hand[0].chopped:
        name = in_hand[0].name
        labels[4] = f"put the {name} on the first cutting board"
        labels[5] = f"put the {name} on the second cutting board"
    return tuple(labels)


def _bowl_with(foods: list[str]) -> str:
    if not foods:
        return "an empty bowl"
    return "a bowl with chopped " + " and chopped ".join(foods)


def _food_phrase(item: ObservedItem) -> str:
    return f"a chopped {item.name}" if item.chopped else f"an unchopped {item.name}"


def _carrying(in_hand: list[ObservedItem]) -> str:
    if not in_hand:
        return "You are not carrying anything."
    if len(in_hand) == 1:
        item = in_hand[0]
        if item.name == "plate":
            return "You are carrying an empty bowl."
        return f"You are carrying {_food_phrase(item)}."
    return f"You are carrying {_bowl_with([i.name for i in in_hand if i.name != 'plate'])}."


@functools.lru_cache(maxsize=None)
def prompt(obs: tuple[int, ...], task: T.KitchenTask) -> str:
    """The A.11 prompt for observation `obs`, ending where an action label continues it."""
    items, agent = observed_items(obs, task)
    n_boards = len(task.knives)
    parts = [
        "You are a chef in a small kitchen that has "
        + ("one fixed cutting board." if n_boards == 1 else "two fixed cutting boards.")
    ]
    at_start = [item for item in items if item.pos == (T.PLATE_START if item.name == "plate" else T.FOOD_STARTS[item.name])]
    if at_start:
        names = [_display(item.name) for item in at_start]
        listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        parts.append(f"On the counters you see the {listed}.")
    for b, cell in enumerate(task.knives):
        board = "The cutting board" if n_boards == 1 else f"The {BOARD_ORDINALS[b]} cutting board"
        on_board = _at(items, cell)
        if len(on_board) == 1:
            item = on_board[0]
            if item.name == "plate":
                parts.append(f"{board} holds an empty bowl.")
            else:
                parts.append(f"{board} holds {_food_phrase(item)}.")
        elif len(on_board) >= 2:
            foods = ["tomato"] if task.key == "v4" else [i.name for i in on_board if i.name != "plate" and i.chopped]
            parts.append(f"{board} holds {_bowl_with(foods)}.")
    if agent in FRONT_OF_BOARD:
        if n_boards == 1:
            board = "the cutting board"
        else:
            board = f"the {BOARD_ORDINALS[FRONT_OF_BOARD.index(agent)]} cutting board"
        parts.append(f"You are standing in front of {board}.")
    parts.append(_carrying(_at(items, agent)))
    goal = " and ".join(f"chopped {food}" for food in task.goal_foods)
    parts.append(f"Your goal is to serve a bowl containing only {goal}. {NEXT_STEP}")
    return " ".join(parts)
