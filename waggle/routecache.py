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
    replace its own without touching another's."""
    now = time.monotonic()
    with _lock:
        hit = _cache.get(space_key)
        generation = _generation
    if hit is not None and hit[0] == generation and now - hit[1] < TTL:
        return list(hit[2])
    loaded = load(space_key)
    with _lock:
        if keep and generation == _generation:  # no write in this process while it loaded: the rows are current
            _cache[space_key] = (generation, now, loaded)
    return list(loaded)
