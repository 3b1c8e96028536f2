"""A long-lived process's garbage collector, set once it has loaded what it serves with.

CPython's full collection walks every tracked object, and a process that has imported Django, the
apps, the agent stack and the vendors' SDKs holds about a million of them: each full pass took
~85-120 ms, in the middle of whatever that thread was doing (a console page, a run's step), and a
busy process allocates past the 700-object young threshold every few hundred microseconds.
Settled: what is loaded by then is frozen (never walked again, nor written: pages forked from a
parent stay shared) and young objects are collected every 10,000 allocations. A full pass then
walks only what the process made since (~1-2 ms), and cycles made later are collected as before.
"""
from __future__ import annotations

import gc
import os
import sys

THRESHOLD = (10_000, 10, 10)


def settle() -> None:
    gc.collect()  # what start-up left as garbage is not frozen with the rest
    gc.freeze()
    gc.set_threshold(*THRESHOLD)


def serving_with_daphne() -> bool:
    """This process is daphne (`daphne …` or `python -m daphne …`), not a test or a shell importing the app."""
    argv0 = sys.argv[0] if sys.argv else ""
    return os.path.basename(argv0) == "daphne" or argv0.endswith(os.path.join("daphne", "__main__.py"))


class SettleOnFirstRequest:
    """ASGI wrapper: the server settles its collector as it serves its first HTTP request (the URLconf,
    the views and their templates are loaded lazily, by the first request)."""

    def __init__(self, app, enabled: bool) -> None:
        self.app, self.pending = app, enabled

    async def __call__(self, scope, receive, send):
        try:
            return await self.app(scope, receive, send)
        finally:
            if self.pending:
                self.pending = False
                settle()
