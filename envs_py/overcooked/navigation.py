"""Navigation of the macro actions: the original A* with its exact tie-breaking (A.9).

The original orders its heap with a *non-strict* comparison (`f(A) <= f(B)`),
so among nodes of equal `f` the order depends on the heap's internal layout.
Python's `heapq` runs the same CPython algorithm as the original, so wrapping
nodes in a class whose `__lt__` is `<=` reproduces it exactly.  As a result
routes go vertically first, then horizontally.
"""

from __future__ import annotations

import functools
import heapq

from envs_py.overcooked.tasks import GRID_SIZE, STAY

# Neighbour order of the search: (dx, dy, primitive action).
_SEARCH_ORDER = ((0, 1, 0), (0, -1, 2), (1, 0, 1), (-1, 0, 3))


class _Node:
    __slots__ = ("f", "g", "cell", "first")

    def __init__(self, f: int, g: int, cell: tuple[int, int], first: int | None):
        self.f, self.g, self.cell, self.first = f, g, cell, first

    def __lt__(self, other: "_Node") -> bool:
        return self.f <= other.f  # deliberately non-strict, as in the original


def _manhattan(a: tuple[int, int], b: tuple[int, int]) -> int:
    return abs(a[0] - b[0]) + abs(a[1] - b[1])


def interior_cells() -> frozenset[tuple[int, int]]:
    """Cells inside the border ring (the floor)."""
    return frozenset((x, y) for x in range(1, GRID_SIZE - 1) for y in range(1, GRID_SIZE - 1))


@functools.lru_cache(maxsize=None)
def first_step(start: tuple[int, int], target: tuple[int, int],
               passable: frozenset[tuple[int, int]]) -> int:
    """First primitive action of the original A* route from `start` to next to `target`.

    `passable` holds the cells marked free or "agent" in the occupancy map.
    Returns STAY when no route exists.  Pure; memoised (the map is static).
    """
    heap = [_Node(_manhattan(start, target), 0, start, None)]
    visited = {start}
    while heap:
        node = heapq.heappop(heap)
        x, y = node.cell
        for dx, dy, action in _SEARCH_ORDER:
            cell = (x + dx, y + dy)
            if cell in visited:
                continue
            first = action if node.first is None else node.first
            if cell in passable:
                g = node.g + 1
                heapq.heappush(heap, _Node(g + _manhattan(cell, target), g, cell, first))
                visited.add(cell)
            if cell == target:
                return first
    return STAY
