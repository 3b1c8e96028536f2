"""The enabled routes each space sees, kept per process for pinned runs (one read of waggle_waggle per
space every few seconds instead of one per run).

Why a route may reach a new run a little late: a pinned run already keeps the set it first saw for
its whole length (waggle.recording.pinned: "routes promoted meanwhile apply from the next pin"), often
minutes, so a change made in *another* process reaching this process's new runs up to ``TTL`` seconds
later is well within what waggle promises. A change made in *this* process is seen at once: every
write through Waggle's manager or ``save()`` bumps the generation (waggle.models), now and again at
its commit (a reader in another thread may have loaded the rows before that commit).

Pure bookkeeping: the caller loads the rows (waggle.following); no model is imported here.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

TTL = 2.0  # seconds a space's routes are trusted without reading them again (see the module docstring)

_lock = threading.Lock()
_generation = 0
_cache: dict[str, tuple[int, float, list]] = {}  # space_key -> (generation, loaded at, routes)


def changed() -> None:
    """Some Waggle row changed in this process: every cached set is stale."""
    global _generation
    with _lock:
        _generation += 1
        _cache.clear()


class AtCommit:
    """The commit hook of one route write (see waggle.models): until it ran, the writer's transaction
    may still roll the write back, and what that transaction reads must not be kept."""

    ran = False

    def __call__(self) -> None:
        self.ran = True
        changed()


def routes(space_key: str, load: Callable[[str], list], *, keep: bool = True) -> list:
    """The space's routes, from the cache while fresh, else loaded (and kept, unless ``keep`` is false:
    the caller's transaction holds an uncommitted route write) anew. A new list each time: a pin may
    replace its own without touching another's.

    One load per space at a time: the runs a burst of mail starts together (bench/fleet.py: 500 at once,
    50 to a space) all missed the cache before the first load had kept its rows, and 320 of 500 read
    waggle_waggle each, every read a query on a pooled connection of the worker. A thread that finds
    the space being loaded waits for that load (at most LOAD_WAIT seconds), then takes what it kept;
    if it kept nothing (it failed, or a route was written meanwhile, or it is still going), the thread
    loads on its own."""
    hit, generation, other, mine = _look(space_key, join=keep)
    if hit is not None:
        return hit
    if other is not None:  # another thread of this process is loading this space's routes
        other.wait(LOAD_WAIT)
        hit, generation, _, _ = _look(space_key, join=False)
        if hit is not None:
            return hit
    return list(_load(space_key, load, generation, keep, mine))


# Short on purpose: a waiting thread may hold one of its worker's pooled connections, and the load it
# waits for may be queued for one of them. A load takes milliseconds; a wait that runs out costs a read.
LOAD_WAIT = 0.25
_loading: dict[str, threading.Event] = {}  # space_key -> set when the thread loading its routes is done


def _look(space_key: str, *, join: bool) -> tuple[list | None, int, threading.Event | None, threading.Event | None]:
    """(the fresh routes or None, the generation now, another thread's load in progress to wait for,
    this thread's own load to announce): the last two only when ``join``, and at most one of them."""
    now = time.monotonic()
    with _lock:
        hit = _cache.get(space_key)
        if hit is not None and hit[0] == _generation and now - hit[1] < TTL:
            return list(hit[2]), _generation, None, None
        if not join:
            return None, _generation, None, None
        other = _loading.get(space_key)
        if other is not None:
            return None, _generation, other, None
        mine = _loading[space_key] = threading.Event()
        return None, _generation, None, mine


def _load(space_key: str, load: Callable[[str], list], generation: int, keep: bool, mine: threading.Event | None) -> list:
    try:
        now = time.monotonic()
        loaded = load(space_key)
        with _lock:
            if keep and generation == _generation:  # no write in this process while it loaded: the rows are current
                _cache[space_key] = (generation, now, loaded)
        return loaded
    finally:
        if mine is not None:
            with _lock:
                if _loading.get(space_key) is mine:
                    del _loading[space_key]
            mine.set()
