"""A django-q2 worker readies itself when it is spawned, not on its first wake.

A fresh worker's first task paid, on the path from a commit to its run: importing the engine and
the agent (q2 imports a task's module on first use), opening its database connection, and the ORM
compiling the claim's UPDATE. That was every p99 outlier of the hosted wake (≈ 55 ms against ≈ 9 ms
warm, once per worker, again after each recycle). q2's post_spawn signal runs in the worker before
it reads the task queue, while the other workers take the tasks.
"""
from __future__ import annotations

import importlib
import logging

log = logging.getLogger(__name__)

# What a wake and a run import on first use; the providers' SDKs come with their modules.
MODULES = (
    "veronica.engine.runner",
    "veronica.agent.loop",
    "veronica.agent.providers.offline",
    "veronica.agent.providers.openai_compat",
    "veronica.agent.providers.anthropic",
)
NO_MEMBER = 0  # ids start at 1: the claim compiles, runs and matches no row


def warm_worker(**_) -> None:
    """post_spawn receiver: the worker's run pool (veronica.engine.fleet), then the warm-up. Best effort: a worker that cannot warm up (the database down at spawn)
    still starts, and its first wake pays the cost as before."""
    from django.db import connections

    from veronica.engine import fleet

    fleet.enable()  # this worker's run pool (and its connection pool), before it reads a task
    try:
        for name in MODULES:
            importlib.import_module(name)
        from veronica.engine import slot
        from veronica.engine.runner import MAIL_SOURCES

        for source in MAIL_SOURCES[:1] + ("timer",):
            slot.claim(NO_MEMBER, source, gates=("breaker", "mail") if source in MAIL_SOURCES else ("breaker",))
    except Exception:
        log.warning("worker warm-up failed; its first wake will warm it", exc_info=True)
        connections.close_all()  # a broken connection is not handed to the first task
