"""A compact memory of an ALFWorld-style episode for the prompt: what each place showed, what is held, what was done.

A prompt shows the last few steps; a search over twenty receptacles needs to know all the places already seen, which
the searching expert remembers and a policy reading four steps of history cannot. :class:`PlaceMemory` folds an
episode's observations into one line, parsed from ALFWorld's own feedback phrasing (which MiniHouse speaks too)::

    Seen: countertop 1 (apple 1, knife 1), cabinet 2 (closed), drawer 1 (nothing). Holding: apple 1.
    Done: clean cup 1.

Only what the text said is remembered (a closed receptacle's contents are unknown until it is opened), so the memory
is a function of the transcript: the :class:`Memory` wrapper keeps it in ``info["memory"]`` during training and
:meth:`agents.gagpo.GAGPOAgent.predict` folds the same observations in a plain Gymnasium loop. A text the parser
does not recognise changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import gymnasium as gym

_NAME = r"[a-z][a-z ]*? \d+"  # "countertop 1", "shelf 12": ALFWorld names a thing by type and number
_CLOSED = re.compile(rf"The ({_NAME}) is closed\.")
_LISTING = re.compile(rf"(?:On the ({_NAME}), you see|The ({_NAME}) is open\. In it, you see) (.*?)\.(?:\s|$)")
_TAKE = re.compile(rf"You pick up the ({_NAME}) from the ({_NAME})\.")
_PUT = re.compile(rf"You (?:move|put) the ({_NAME}) (?:to|in|on|in/on) the ({_NAME})\.")
_PROCESS = re.compile(rf"You (heat|cool|clean) the ({_NAME}) using the ({_NAME})\.")
_ITEM = re.compile(rf"(?:an? )?({_NAME})")


def listed_items(listing: str) -> list[str]:
    """The names in ALFWorld's list ("nothing", "a x", "a x, a y, and a z")."""
    if listing.strip() == "nothing":
        return []
    return [m.group(1) for part in re.split(r",\s*(?:and\s+)?|\s+and\s+", listing) if (m := _ITEM.fullmatch(part))]


class PlaceMemory:
    """What an episode's observations said, place by place (in the order first seen)."""

    def __init__(self) -> None:
        self.places: dict[str, list[str] | None] = {}  # receptacle -> the items last seen in or on it (None: closed)
        self.holding: str | None = None
        self.done: list[str] = []

    @classmethod
    def of(cls, observations: Iterable[str]) -> PlaceMemory:
        memory = cls()
        for text in observations:
            memory.observe(text)
        return memory

    def observe(self, text: str) -> None:
        """Remember what one observation (an env's feedback to a command) showed."""
        for m in _CLOSED.finditer(text):
            self.places.setdefault(m.group(1), None)  # a closed receptacle seen before keeps what it held
        for m in _LISTING.finditer(text):
            self.places[m.group(1) or m.group(2)] = listed_items(m.group(3))
        for m in _TAKE.finditer(text):
            item, place = m.groups()
            if self.places.get(place) and item in self.places[place]:
                self.places[place].remove(item)
            self.holding = item
        for m in _PUT.finditer(text):
            item, place = m.groups()
            if self.places.get(place) is not None and item not in self.places[place]:
                self.places[place].append(item)
            self.holding = None if self.holding == item else self.holding
        for m in _PROCESS.finditer(text):
            entry = f"{m.group(1)} {m.group(2)}"
            if entry not in self.done:
                self.done.append(entry)

    def render(self) -> str:
        """One line for the prompt ("" when nothing is remembered)."""
        parts = []
        if self.places:
            seen = [f"{p} ({'closed' if v is None else ', '.join(v) or 'nothing'})" for p, v in self.places.items()]
            parts.append("Seen: " + ", ".join(seen) + ".")
        if self.holding:
            parts.append(f"Holding: {self.holding}.")
        if self.done:
            parts.append("Done: " + ", ".join(self.done) + ".")
        return " ".join(parts)


class Memory(gym.Wrapper):
    """``info["memory"]``: the :class:`PlaceMemory` of the episode so far, rendered, for prompt building."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.memory = PlaceMemory()

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        self.memory = PlaceMemory.of([obs])
        return obs, {**info, "memory": self.memory.render()}

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.memory.observe(obs)
        return obs, reward, terminated, truncated, {**info, "memory": self.memory.render()}
