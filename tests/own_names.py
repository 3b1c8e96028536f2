"""The names a test session makes in the Redis it is given, and their removal at its end.

Tests are good neighbours: a session on a shared Redis (CI's, a developer's) leaves nothing behind.
Every queue, channel prefix, doorbell and limiter key this session makes carries SESSION_TAG, so two
sessions on one server never take each other's wakes, and `sweep` drops exactly this session's keys
(the in-process tests ring wakes no cluster takes; clusters and servers are killed mid-queue).
"""
from __future__ import annotations

import os
import uuid

SESSION_TAG = f"vt{uuid.uuid4().hex[:8]}"


def own_name(kind: str) -> str:
    """A queue or prefix of one test's own, inside this session's."""
    return f"{SESSION_TAG}-{kind}-{uuid.uuid4().hex[:8]}"


def claim_session_names() -> None:
    """Point this process, and every child it starts with its environment, at the session's own queue
    and channel prefix. Settings are loaded before any conftest (pytest-django), so the loaded values
    are replaced as tests/harness.isolate_queue does."""
    from django.conf import settings
    from django_q.conf import Conf

    os.environ["VERONICA_Q_NAME"] = Conf.PREFIX = Conf.CLUSTER_NAME = SESSION_TAG
    settings.Q_CLUSTER["name"] = SESSION_TAG
    if getattr(settings, "REDIS_URL", None):
        os.environ["VERONICA_CHANNEL_PREFIX"] = settings.CHANNEL_PREFIX = SESSION_TAG
        settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"] = SESSION_TAG
        from channels.layers import channel_layers

        channel_layers.backends.clear()  # a layer built with the old prefix, if any, is built again


def sweep(url: str) -> int:
    """Delete every key of this session's (any database of the URL's server is another's: only its own)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"*{SESSION_TAG}*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start:start + 500])
        return len(keys)
    finally:
        client.close()
