"""Forage recorder: a bounded ring of one session's most recent calls (pure Python)."""
from __future__ import annotations

from collections import deque
from typing import Iterable

from waggle.trace import Call

DEFAULT_CAPACITY = 200


class Recorder:
    """Keeps at most ``capacity`` recent calls; the oldest fall off. A non-positive capacity means
    the default (200). ``last_seq`` is the sequence number of the newest call, which lets a cache
    of recorders notice when another process has appended to the same session."""

    __slots__ = ("capacity", "_ring", "last_seq")

    def __init__(self, capacity: int | None = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity if capacity and capacity > 0 else DEFAULT_CAPACITY
        self._ring: deque[Call] = deque(maxlen=self.capacity)
        self.last_seq = 0

    def record(self, call: Call, seq: int | None = None) -> None:
        self._ring.append(call)
        self.last_seq = seq if seq is not None else self.last_seq + 1

    def extend(self, calls: Iterable[Call]) -> None:
        for call in calls:
            self.record(call)

    def recent(self, n: int | None = None) -> list[Call]:
        """The newest ``n`` calls (all when ``n`` is None), oldest first."""
        if n is None or n >= len(self._ring):
            return list(self._ring)
        if n <= 0:
            return []
        return list(self._ring)[-n:]

    def clear(self) -> None:
        self._ring.clear()

    def __len__(self) -> int:
        return len(self._ring)
