"""MiniHouse: ALFWorld's six household tasks in procedurally generated rooms, in pure Python.

It speaks ALFWorld's command grammar and answers in its words, so that a policy trained here can be evaluated
unchanged on the real games (``gagpo_gym/ALFWorld-v0``), and it runs in microseconds, so that a small model can
learn small houses on a CPU.
"""

from __future__ import annotations

import hashlib
from typing import Any

from gagpo_gym.core import TextEnv, normalize_command
from gagpo_gym.envs.minihouse import vocab
from gagpo_gym.envs.minihouse.house import House, HouseConfig, SearchingExpert, SweepingExpert, generate

#: ``door_weight`` of full-size houses: ALFWorld's valid_seen games start 12% of their goal objects behind a door,
#: uniform placement here started 34% there, this weight 12% (lab/research/minihouse_fidelity.py, 500 houses).
FULL_DOOR_WEIGHT = 0.2
#: Size presets. ``None`` means as in ALFWorld's scenes (room-kind statistics, see ``vocab``).
SIZES: dict[str, dict[str, Any]] = {
    "small": {
        "n_receptacles": (4, 6),
        "n_distractor_objects": (2, 4),
        "n_targets": (1, 2),
        "n_targets_pick2": (2, 3),
        "door_weight": 1.0,
    },
    "medium": {
        "n_receptacles": (8, 12),
        "n_distractor_objects": (6, 10),
        "n_targets": (1, 3),
        "n_targets_pick2": (2, 3),
        "door_weight": 1.0,
    },
    "full": {
        "n_receptacles": None,
        "n_distractor_objects": None,
        "n_targets": (1, 3),
        "n_targets_pick2": (2, 4),
        "door_weight": FULL_DOOR_WEIGHT,
    },
}
_ROOM_ALIASES = {"living room": "livingroom", "living_room": "livingroom"}
_CACHE_LIMIT = 200_000


class MiniHouseEnv(TextEnv):
    """ALFWorld-like household tasks: pick, look, clean, heat, cool, pick2.

    Args:
        size: ``"small"`` (4-6 receptacles, 2-4 distractor objects), ``"medium"`` (8-12, 6-10) or ``"full"``
            (receptacle and object counts as in ALFWorld's scenes: 7-50 receptacles, 12-45 objects).
        n_receptacles: overrides the preset: an int or an inclusive ``(min, max)`` range. The receptacles a task
            needs (its goal receptacle, appliance, lamp holder, a start place) are always there.
        n_distractor_objects: overrides the preset's number of non-target objects (int or range).
        task_types: a subset of ``("pick", "look", "clean", "heat", "cool", "pick2")`` (ALFWorld's long names
            are accepted too); each reset draws one uniformly. Default: all that ``room_kinds`` allow.
        room_kinds: a subset of ``("kitchen", "livingroom", "bedroom", "bathroom")``; a task type is only set in
            the room kinds where ALFWorld sets it (heat and cool in kitchens, look in living rooms and bedrooms...).
        door_weight: overrides the preset's relative chance that an object starts behind a door rather than in the
            open (small and medium: 1, uniform over the receptacles that can hold it; full: ``FULL_DOOR_WEIGHT``).
        render_mode: ``"ansi"`` or ``"human"``.

    ``reset(seed=s)`` builds task ``s`` (the same on every machine); ``task_id`` is ``"minihouse/<size>/<s>"``
    (``<size>-<hash>`` when the preset was overridden).

    Three experts (:meth:`expert_action`): ``"oracle"`` (default) reads the true state and never explores;
    ``"search"`` (:class:`~gagpo_gym.envs.minihouse.house.SearchingExpert`) knows only what the transcript showed
    and searches, as a person playing the game would; ``"sweep"``
    (:class:`~gagpo_gym.envs.minihouse.house.SweepingExpert`) searches in a fixed cyclic order and remembers no
    place, so its next command follows from what the current observation shows.
    """

    #: The kinds of :meth:`expert_action`.
    EXPERTS = ("oracle", "search", "sweep")

    def __init__(
        self,
        size: str = "full",
        *,
        n_receptacles: int | tuple[int, int] | None = None,
        n_distractor_objects: int | tuple[int, int] | None = None,
        task_types: list[str] | tuple[str, ...] | None = None,
        room_kinds: list[str] | tuple[str, ...] | None = None,
        door_weight: float | None = None,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(render_mode=render_mode)
        if size not in SIZES:
            raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
        preset = SIZES[size]
        kinds = _room_kinds(room_kinds)
        types = _task_types(task_types)
        if task_types is None:  # by default, every task type that the chosen room kinds allow
            types = tuple(t for t in types if set(vocab.TASK_ROOMS[t]) & set(kinds))
        for task_type in types:
            if not set(vocab.TASK_ROOMS[task_type]) & set(kinds):
                raise ValueError(
                    f"task type {task_type!r} needs one of the room kinds {list(vocab.TASK_ROOMS[task_type])}, "
                    f"but room_kinds is {list(kinds)}"
                )
        self.config = HouseConfig(
            n_receptacles=_range("n_receptacles", n_receptacles, 1) or preset["n_receptacles"],
            n_distractors=_range("n_distractor_objects", n_distractor_objects, 0) or preset["n_distractor_objects"],
            n_targets=preset["n_targets"],
            n_targets_pick2=preset["n_targets_pick2"],
            task_types=types,
            room_kinds=kinds,
            door_weight=preset["door_weight"] if door_weight is None else _weight(door_weight),
        )
        default = HouseConfig(
            n_receptacles=preset["n_receptacles"],
            n_distractors=preset["n_distractor_objects"],
            n_targets=preset["n_targets"],
            n_targets_pick2=preset["n_targets_pick2"],
            task_types=tuple(vocab.TASK_TYPES),
            room_kinds=vocab.ROOM_KINDS,
            door_weight=preset["door_weight"],
        )
        digest = hashlib.blake2b(repr(self.config).encode(), digest_size=3).hexdigest()
        self.size_label = size if self.config == default else f"{size}-{digest}"
        self.house: House | None = None
        self.searcher: SearchingExpert | None = None
        self._cache: dict[str, tuple[list[str], dict[str, tuple]]] = {}
        self._cache_task = ""

    # ----- TextEnv API ----------------------------------------------------------------------------------
    def _new_task(self, seed: int | None, options: dict[str, Any]) -> str:
        if seed is None:
            seed = int(self.np_random.integers(2**31 - 1))
        task_id = f"minihouse/{self.size_label}/{seed}"
        self.house = generate(seed, self.config, task_id)
        self.searcher = SearchingExpert(self.house)  # its memory of the transcript starts afresh
        self.task, self.task_id, self.task_type = self.house.task, task_id, self.house.task_type
        self.won = False
        if task_id != self._cache_task:  # the admissible lists of a task stay valid across its episodes
            self._cache, self._cache_task = {}, task_id
        return self.house.intro()

    def _execute(self, command: str) -> tuple[str, float, bool]:
        house = self._require_house()
        op = self._commands()[1][command]
        text = house.execute(op)
        self.searcher.observe(op)
        self.won = house.won
        return text, float(house.won), house.won

    def admissible_actions(self) -> list[str]:
        return self._commands()[0]

    def canonical_action(self, action: Any) -> str | None:
        command = normalize_command(action)
        if command is None or self.house is None:
            return None
        return command if command in self._commands()[1] else None

    def state_string(self) -> str:
        return self._require_house().state_string()

    def expert_action(self, kind: str | None = None) -> str:
        """The next command of an expert: ``"oracle"`` reads the true state and never explores; ``"search"`` knows
        only what the transcript showed (the intro's receptacles, the contents of those it looked into) and
        searches the places where the goal object can be; ``"sweep"`` searches them in a fixed cyclic order,
        remembering no place. ``None``: the oracle."""
        kind = self._expert_kind(kind)
        house = self._require_house()
        if kind == "oracle":
            return house.expert_command(self._commands()[1])
        if kind == "search":
            return self.searcher.command(self._commands()[1])
        return SweepingExpert(house, self.searcher.processed).command(self._commands()[1])

    # ----- internals ------------------------------------------------------------------------------------
    def _commands(self) -> tuple[list[str], dict[str, tuple]]:
        house = self._require_house()
        key = house.state_string()
        entry = self._cache.get(key)
        if entry is None:
            ops = house.commands()
            entry = (sorted(ops), ops)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = entry
        return entry

    def _require_house(self) -> House:
        if self.house is None:
            raise RuntimeError("call reset() before using the env")
        return self.house


def _task_types(task_types) -> tuple[str, ...]:
    if task_types is None:
        return tuple(vocab.TASK_TYPES)
    long_names = {long: short for short, long in vocab.TASK_TYPES.items()}
    return _choose(task_types, vocab.TASK_TYPES, lambda name: long_names.get(name, name), "task type", "task_types")


def _room_kinds(room_kinds) -> tuple[str, ...]:
    if room_kinds is None:
        return vocab.ROOM_KINDS
    return _choose(
        room_kinds, vocab.ROOM_KINDS, lambda name: _ROOM_ALIASES.get(str(name).lower(), str(name).lower()),
        "room kind", "room_kinds",
    )  # fmt: skip


def _choose(names, allowed, canonical, singular: str, plural: str) -> tuple[str, ...]:
    """Canonical, de-duplicated names in the given order; one ValueError for an unknown name or an empty list."""
    if isinstance(names, str):
        names = [names]
    chosen: list[str] = []
    for name in names:
        value = canonical(name)
        if value not in allowed:
            raise ValueError(f"unknown {singular} {name!r}; choose from {list(allowed)}")
        if value not in chosen:
            chosen.append(value)
    if not chosen:
        raise ValueError(f"{plural} must name at least one {singular}")
    return tuple(chosen)


def _weight(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1e6:
        raise ValueError(f"door_weight must be a positive number, got {value!r}")
    return float(value)


def _range(name: str, value, minimum: int) -> tuple[int, int] | None:
    """``None``, an int or an inclusive ``(min, max)`` pair, as a checked pair."""
    if value is None:
        return None
    pair = (value, value) if isinstance(value, int) and not isinstance(value, bool) else value
    try:
        low, high = pair
        ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high)) and minimum <= low <= high
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"{name} must be an int >= {minimum} or a (min, max) pair of such ints, got {value!r}")
    return (low, high)
