"""The treasure hunt: a procedurally generated grid maze with named rooms, a start and a treasure.

Each task is a maze of ``width x height`` cells with walls between neighbouring cells. A few rectangular
rooms (no inner walls) are carved first, a random spanning tree connects every cell, and ``loops`` extra
openings add cycles, so different paths lead to the same cell and states are revisited often. The start and
the treasure are a pair of cells whose shortest path has ``min_path..max_path`` steps.

Commands are ``go north|south|east|west``; the admissible ones are the open directions. Reaching the treasure
gives reward 1 and ends the episode. ``view="local"`` (default) describes only the current cell, its exits and
the compass direction of the treasure (partial observability); ``view="map"`` adds the full ASCII map.

The true state is the position; the layout is fixed per task, so the key is ``(task_id, position)``.
"""

from __future__ import annotations

import hashlib
from collections import deque
from typing import Any

from gagpo_gym.core import TextEnv

Cell = tuple[int, int]

#: Direction name -> (row delta, column delta); this order is also the order of admissible actions.
DIRECTIONS: dict[str, Cell] = {"north": (-1, 0), "south": (1, 0), "east": (0, 1), "west": (0, -1)}
ROOM_NAMES = (
    "library",
    "kitchen",
    "armory",
    "chapel",
    "cellar",
    "gallery",
    "vault",
    "study",
    "crypt",
    "greenhouse",
    "ballroom",
    "workshop",
)
VIEWS = ("local", "map")


def _step(cell: Cell, direction: str) -> Cell:
    dr, dc = DIRECTIONS[direction]
    return cell[0] + dr, cell[1] + dc


def _compass(dr: int, dc: int) -> str:
    """Compass word for a displacement, e.g. (2, 1) -> 'south-east'."""
    vertical = "north" if dr < 0 else "south" if dr > 0 else ""
    horizontal = "west" if dc < 0 else "east" if dc > 0 else ""
    return "-".join(part for part in (vertical, horizontal) if part)


class _UnionFind:
    def __init__(self, items: list[Cell]) -> None:
        self.parent = {item: item for item in items}

    def find(self, item: Cell) -> Cell:
        while self.parent[item] != item:
            self.parent[item] = self.parent[self.parent[item]]
            item = self.parent[item]
        return item

    def union(self, a: Cell, b: Cell) -> bool:
        root_a, root_b = self.find(a), self.find(b)
        if root_a == root_b:
            return False
        self.parent[root_b] = root_a
        return True


class MazeEnv(TextEnv):
    """Find the treasure in a grid maze with rooms (``gagpo_gym/Maze-v0``)."""

    #: The kinds of :meth:`expert_action`: one, a shortest path from the true state.
    EXPERTS = ("oracle",)

    def __init__(
        self,
        width: int = 5,
        height: int = 5,
        rooms: int = 2,
        room_size: int = 2,
        loops: int = 3,
        min_path: int = 3,
        max_path: int = 8,
        view: str = "local",
        render_mode: str | None = None,
    ) -> None:
        for name, value, low in (
            ("width", width, 2),
            ("height", height, 2),
            ("rooms", rooms, 0),
            ("room_size", room_size, 2),
            ("loops", loops, 0),
            ("min_path", min_path, 1),
            ("max_path", max_path, 1),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if width > 30 or height > 30:
            raise ValueError(f"width and height must be <= 30, got {width}x{height}")
        if rooms > len(ROOM_NAMES):
            raise ValueError(f"rooms must be <= {len(ROOM_NAMES)}, got {rooms}")
        if room_size > min(width, height):
            raise ValueError(f"room_size must fit in the maze (<= {min(width, height)}), got {room_size}")
        if min_path > max_path:
            raise ValueError(f"min_path ({min_path}) must be <= max_path ({max_path})")
        if min_path > width * height - 1:
            raise ValueError(f"min_path must be < the number of cells ({width * height}), got {min_path}")
        if view not in VIEWS:
            raise ValueError(f"view must be one of {VIEWS}, got {view!r}")
        super().__init__(render_mode=render_mode)
        self.width, self.height = width, height
        self.n_rooms, self.room_size, self.loops = rooms, room_size, loops
        self.min_path, self.max_path = min_path, max_path
        self.view = view
        self.exits: dict[Cell, tuple[str, ...]] = {}
        self.room_of: dict[Cell, str] = {}
        self.start: Cell = (0, 0)
        self.treasure: Cell = (0, 0)
        self.pos: Cell = (0, 0)
        self.distance: dict[Cell, int] = {}

    # ----- task generation ----------------------------------------------------------------------------
    def _new_task(self, seed: int | None, options: dict[str, Any]) -> str:
        for _ in range(100):
            self._generate_layout()
            pairs = [(a, b) for a in self.exits for b, d in self._bfs(a).items() if self.min_path <= d <= self.max_path]
            if pairs:
                break
        else:
            raise ValueError(
                f"no start/treasure pair at distance {self.min_path}..{self.max_path} in a "
                f"{self.width}x{self.height} maze; widen the path range"
            )
        self.start, self.treasure = pairs[int(self.np_random.integers(len(pairs)))]
        self.pos = self.start
        self.distance = self._bfs(self.treasure)
        place = self.room_of.get(self.treasure)
        self.task = "Find the treasure" + (f", hidden in the {place}." if place else ", hidden in a corridor.")
        digest = hashlib.blake2b(self._map_text(show_player=False).encode(), digest_size=6).hexdigest()
        self.task_id = f"maze-{self.width}x{self.height}-{digest}"
        return f"{self.task} {self._describe()}"

    def _generate_layout(self) -> None:
        """Rooms first, then a random spanning tree (Kruskal) over the rest, then ``loops`` extra openings."""
        cells = [(r, c) for r in range(self.height) for c in range(self.width)]
        openings: set[frozenset[Cell]] = set()
        union = _UnionFind(cells)
        self.room_of = {}
        names = [ROOM_NAMES[i] for i in self.np_random.permutation(len(ROOM_NAMES))[: self.n_rooms]]
        for name in names:
            for _ in range(50):  # a few tries to place a room that overlaps no other
                h, w = (int(x) for x in self.np_random.integers(2, self.room_size + 1, size=2))
                top = int(self.np_random.integers(0, self.height - h + 1))
                left = int(self.np_random.integers(0, self.width - w + 1))
                room = [(r, c) for r in range(top, top + h) for c in range(left, left + w)]
                if not any(cell in self.room_of for cell in room):
                    break
            else:
                continue
            for cell in room:
                self.room_of[cell] = name
                for direction in ("south", "east"):
                    other = _step(cell, direction)
                    if other in room:
                        openings.add(frozenset((cell, other)))
                        union.union(cell, other)
        edges = [
            (cell, _step(cell, d))
            for cell in cells
            for d in ("south", "east")
            if _step(cell, d)[0] < self.height and _step(cell, d)[1] < self.width
        ]
        extra = []
        for i in self.np_random.permutation(len(edges)):
            a, b = edges[i]
            if frozenset((a, b)) in openings:
                continue
            if union.union(a, b):
                openings.add(frozenset((a, b)))
            else:
                extra.append(frozenset((a, b)))
        openings.update(extra[: self.loops])
        self.exits = {
            cell: tuple(d for d in DIRECTIONS if frozenset((cell, _step(cell, d))) in openings) for cell in cells
        }

    def _bfs(self, source: Cell) -> dict[Cell, int]:
        distance = {source: 0}
        queue = deque([source])
        while queue:
            cell = queue.popleft()
            for d in self.exits[cell]:
                nxt = _step(cell, d)
                if nxt not in distance:
                    distance[nxt] = distance[cell] + 1
                    queue.append(nxt)
        return distance

    # ----- dynamics -----------------------------------------------------------------------------------
    def _execute(self, command: str) -> tuple[str, float, bool]:
        direction = command.split()[1]
        self.pos = _step(self.pos, direction)
        if self.pos == self.treasure:
            self.won = True
            return f"You walk {direction}. You found the treasure!", 1.0, True
        return f"You walk {direction}. {self._describe()}", 0.0, False

    def admissible_actions(self) -> list[str]:
        return [f"go {d}" for d in self.exits[self.pos]]

    def state_string(self) -> str:
        return f"maze|{self.task_id}|{self.pos[0]},{self.pos[1]}"

    def expert_action(self, kind: str | None = None) -> str:
        """A step along a shortest path (BFS distances from the treasure; ties go to the first direction)."""
        self._expert_kind(kind)
        best = min(self.exits[self.pos], key=lambda d: self.distance[_step(self.pos, d)])
        return f"go {best}"

    # ----- text ---------------------------------------------------------------------------------------
    def _describe(self) -> str:
        exits = self.exits[self.pos]
        room = self.room_of.get(self.pos)
        if room:
            place = f"the {room}"
        elif len(exits) == 1:
            place = "a dead end"
        elif len(exits) == 2:
            straight = set(exits) in ({"north", "south"}, {"east", "west"})
            place = "a narrow corridor" if straight else "a bend in the corridor"
        else:
            place = "a junction" if len(exits) == 3 else "a crossroads"
        dr, dc = self.treasure[0] - self.pos[0], self.treasure[1] - self.pos[1]
        near = " nearby" if abs(dr) + abs(dc) <= 2 else ""
        text = f"You are in {place}. Exits: {', '.join(exits)}. The treasure glints{near} to the {_compass(dr, dc)}."
        if self.view == "map":
            text += "\nMap (# wall, . floor, P you, T treasure, north is up):\n" + self._map_text(show_player=True)
        return text

    def _map_text(self, show_player: bool) -> str:
        rows = [["#"] * (2 * self.width + 1) for _ in range(2 * self.height + 1)]
        for (r, c), exits in self.exits.items():
            rows[2 * r + 1][2 * c + 1] = "."
            for d in exits:
                dr, dc = DIRECTIONS[d]
                rows[2 * r + 1 + dr][2 * c + 1 + dc] = "."
        rows[2 * self.treasure[0] + 1][2 * self.treasure[1] + 1] = "T"
        if show_player:
            rows[2 * self.pos[0] + 1][2 * self.pos[1] + 1] = "P"
        else:
            rows[2 * self.start[0] + 1][2 * self.start[1] + 1] = "S"
        return "\n".join("".join(row) for row in rows)
