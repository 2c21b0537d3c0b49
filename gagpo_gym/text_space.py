"""TextSpace: a ``gymnasium.spaces.Text`` that holds any Unicode text, and works in Gymnasium's shared memory.

Gymnasium's ``Text`` holds only the characters of a finite charset, and its shared-memory reader decodes the
buffer once, so ``AsyncVectorEnv`` (shared memory is its default) returns the first, empty contents ('000...')
for ever after. A ``TextSpace`` holds every string of UTF-8-encodable characters except the C0/C1 control
characters (tab, newline, carriage return, vertical tab and form feed are allowed); its charset is only the
alphabet that :meth:`sample` draws from. It is flattened to Unicode code points (0 pads: NUL is not a member)
and read from shared memory through a live view, so ``gymnasium.make_vec(..., vectorization_mode="async")``
works with its defaults.
"""

from __future__ import annotations

import multiprocessing
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.spaces import Box, Text
from gymnasium.spaces.utils import flatten, flatten_space, unflatten
from gymnasium.vector.utils import create_shared_memory, read_from_shared_memory, write_to_shared_memory

#: Characters no TextSpace holds: control characters other than \t \n \v \f \r, and lone surrogates (not UTF-8).
FORBIDDEN = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
_CODE = np.dtype("<u4")


class TextSpace(Text):
    """Unicode text of ``min_length .. max_length`` characters; ``charset`` is the alphabet :meth:`sample` uses."""

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length and not FORBIDDEN.search(x)

    def __repr__(self) -> str:
        return f"TextSpace({self.min_length}, {self.max_length}, Unicode text without control characters)"


def _encode(space: TextSpace, text: str) -> np.ndarray:
    codes = np.zeros(space.max_length, dtype=np.int32)
    raw = np.frombuffer(text.encode("utf-32-le"), dtype=_CODE)
    codes[: len(raw)] = raw
    return codes


def _decode(codes: np.ndarray) -> str:
    end = np.flatnonzero(codes == 0)
    used = codes[: end[0]] if len(end) else codes
    return used.astype(_CODE).tobytes().decode("utf-32-le")


@flatten.register(TextSpace)
def _flatten(space: TextSpace, x: str) -> np.ndarray:
    return _encode(space, x)


@unflatten.register(TextSpace)
def _unflatten(space: TextSpace, x: np.ndarray) -> str:
    return _decode(np.asarray(x))


@flatten_space.register(TextSpace)
def _flatten_space(space: TextSpace) -> Box:
    return Box(low=0, high=0x10FFFF, shape=(space.max_length,), dtype=np.int32)


class SharedTexts(Sequence):
    """The texts in a shared buffer, decoded on every access (a live view, as ``AsyncVectorEnv`` expects).

    ``copy.deepcopy`` (what ``AsyncVectorEnv`` returns with its default ``copy=True``) gives a plain tuple.
    """

    def __init__(self, codes: np.ndarray) -> None:
        self._codes = codes

    def __len__(self) -> int:
        return len(self._codes)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        return _decode(self._codes[index])

    def __deepcopy__(self, memo: dict) -> tuple[str, ...]:
        return tuple(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    def __repr__(self) -> str:
        return f"SharedTexts({tuple(self)!r})"


@create_shared_memory.register(TextSpace)
def _create_shared_memory(space: TextSpace, n: int = 1, ctx: Any = multiprocessing) -> Any:
    return ctx.Array(np.dtype(np.int32).char, n * space.max_length)


@read_from_shared_memory.register(TextSpace)
def _read_from_shared_memory(space: TextSpace, shared_memory: Any, n: int = 1) -> SharedTexts:
    return SharedTexts(np.frombuffer(shared_memory.get_obj(), dtype=np.int32).reshape(n, space.max_length))


@write_to_shared_memory.register(TextSpace)
def _write_to_shared_memory(space: TextSpace, index: int, value: str, shared_memory: Any) -> None:
    size = space.max_length
    destination = np.frombuffer(shared_memory.get_obj(), dtype=np.int32)
    destination[index * size : (index + 1) * size] = _encode(space, value)
