"""Requests of many threads handled together, by whichever of them comes first (no thread of its own).

A worker's run pool starts hundreds of runs at once when a burst of mail or a dead worker's resumes
arrive, and each run's first statement is its claim. One claim per transaction held a pooled
connection across three round trips, each a wait for the GIL among the pool's busy threads: with 8
connections a worker claimed ~125 members a second, and a run's claim waited ~1 s for a connection
in a burst of 500 (bench/fleet.py). Gathered, the thread that finds no one handling claims handles
every claim pending then in one call (one statement, one commit), and the others wait for theirs;
claims that arrive meanwhile are the next call's. A lone request is handled at once by its own
thread, as before: gathering costs nothing when nothing else is waiting.

The leader hands the lead on when its own request is done, to the oldest request still pending,
so no thread serves others for longer than one call beyond its own.
"""
from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any, Callable, Hashable

log = logging.getLogger(__name__)

OWN_WAY = object()  # a result: this request goes its own way (the handler raised, or declined it)


class _Raised:
    __slots__ = ("exc",)

    def __init__(self, exc: Exception) -> None:
        self.exc = exc


class _Ask:
    __slots__ = ("group", "item", "result", "done", "event")

    def __init__(self, group: tuple, item: Any) -> None:
        self.group, self.item = group, item
        self.result: Any = None
        self.done = False
        self.event = threading.Event()  # set once: the request is done, or its thread is to lead

    def outcome(self) -> Any:
        if isinstance(self.result, _Raised):
            raise self.result.exc
        return self.result


class Gathering:
    def __init__(self, most: int = 64) -> None:
        self.most = most
        self._lock = threading.Lock()
        self._pending: deque[_Ask] = deque()
        self._leading = False

    def ask(self, handle: Callable[[Hashable, list], list], args: Hashable, item: Any) -> Any:
        """handle(args, items) -> one result per item, in order, called once for every request pending
        with the same handle and args (up to `most`): this request's result. When that call raises, a
        request that was alone in it raises the same; several get OWN_WAY (logged): each goes its own way."""
        me = _Ask((handle, args), item)
        with self._lock:
            self._pending.append(me)
            lead = not self._leading
            self._leading = True
        if not lead:
            me.event.wait()
            if me.done:
                return me.outcome()
        try:
            while not me.done:  # (at most once: this request is the oldest pending when its thread leads)
                with self._lock:
                    taken = [self._pending.popleft() for _ in range(min(self.most, len(self._pending)))]
                self._serve(taken)
        finally:
            with self._lock:
                heir = self._pending[0] if self._pending else None
                self._leading = heir is not None
            if heir is not None:
                heir.event.set()  # not done: its thread leads next
        return me.outcome()

    def _serve(self, taken: list[_Ask]) -> None:
        groups: dict[tuple, list[_Ask]] = {}
        for ask in taken:
            groups.setdefault(ask.group, []).append(ask)
        try:
            for (handle, args), asks in groups.items():
                try:
                    results = handle(args, [ask.item for ask in asks])
                    if len(results) != len(asks):
                        raise RuntimeError(f"{len(results)} results for {len(asks)} requests")
                except Exception as exc:
                    if len(asks) == 1:  # its own call: the error is its own
                        results = [_Raised(exc)]
                    else:
                        log.warning("a gathered call of %d requests failed; each goes its own way", len(asks), exc_info=True)
                        results = [OWN_WAY] * len(asks)
                for ask, result in zip(asks, results):
                    ask.result, ask.done = result, True
                    ask.event.set()
        finally:  # (a BaseException on the way: no request waits for ever)
            for ask in taken:
                if not ask.done:
                    ask.result, ask.done = OWN_WAY, True
                    ask.event.set()
