"""The hosted mode's doorbell for event streams: one Redis PUBLISH per ring, one pattern subscription
per event loop that streams.

A ring only says "look": a feed (veronica.web.consumers) reads committed rows by seq and polls as its
backstop, so a ring needs no delivery guarantee, and Redis pub/sub's at-most-once is enough. It
replaces channels-redis's group_send, which cost every worker ~1-3 ms of CPU per step (group lookup,
a Lua script and msgpack on a thread of its own, for each commit). A PUBLISH that nobody hears costs
the server nothing. Pub/sub ignores Redis's database number, so the channel carries the deployment's
prefix (VERONICA_CHANNEL_PREFIX); a ring from another deployment on the same server could only make
a feed look once for nothing. The ringing connection has replies switched off: a worker's ring is
one socket write, never a round trip.
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
from typing import Callable

from django.conf import settings

log = logging.getLogger(__name__)

SOCKET_TIMEOUT = 2.0  # a ring never holds a worker longer than this, even with Redis unreachable
RETRY_FIRST, RETRY_MAX = 0.5, 5.0  # after a failed connect, rings are dropped this long (doubling)


def enabled() -> bool:
    return bool(settings.REDIS_URL)


def prefix() -> str:
    return f"{settings.CHANNEL_PREFIX}:bell:"


def client_name(role: str) -> str:
    """Each doorbell connection's name in CLIENT LIST: whose it is (deployment, role, process), and
    unique, so an operator (or a test) can drop exactly that connection (CLIENT KILL ID)."""
    return f"{settings.CHANNEL_PREFIX}-bell-{role}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


_client: tuple[int, object] | None = None  # (pid, a redis-py Connection with replies off)
# A redis-py Connection is not thread-safe, and a worker's many runs (veronica.engine.fleet) ring from
# their own threads: two interleaved rings left a half-read reply that _drain then spun on for good.
_lock = threading.Lock()
_retry_at, _retry_after = 0.0, 0.0  # while Redis cannot be reached: when to try again, and the wait


def _connection():
    """This process's ringing connection, with replies switched off (CLIENT REPLY OFF): a ring is a
    write the worker never waits for (~15 us, against ~175 us for a PUBLISH that waits for its count
    of listeners, which nothing reads). redis-py makes the connection (URL, auth, TLS, database).
    None while a failed connect is backing off."""
    global _client, _retry_at, _retry_after
    if _client is None or _client[0] != os.getpid():  # a forked worker gets its own connection
        if time.monotonic() < _retry_at:
            return None
        import redis

        pool = redis.ConnectionPool.from_url(settings.REDIS_URL, socket_timeout=SOCKET_TIMEOUT,
                                             socket_connect_timeout=SOCKET_TIMEOUT, client_name=client_name("ring"))
        conn = pool.make_connection()
        try:
            conn.connect()
            conn.send_command("CLIENT", "REPLY", "OFF", check_health=False)
        except Exception:
            # Unreachable: without a back-off every commit would wait up to SOCKET_TIMEOUT for it.
            first = _retry_after == 0.0
            _retry_after = min(_retry_after * 2, RETRY_MAX) if _retry_after else RETRY_FIRST
            _retry_at = time.monotonic() + _retry_after
            conn.disconnect()
            (log.warning if first else log.debug)(
                "event doorbell: Redis unreachable; rings are dropped for %.1f s (the feeds' poll delivers "
                "the events)", _retry_after, exc_info=first)
            return None
        if _retry_after:
            log.warning("event doorbell: Redis reachable again")
        _retry_at, _retry_after = 0.0, 0.0
        _client = (os.getpid(), conn)
    return _client[1]


def _drain(conn) -> None:
    """A server that ignored REPLY OFF answers every ring: read the answers, so none pile up unread."""
    from redis.exceptions import ResponseError

    while conn.can_read(timeout=0):
        try:
            conn.read_response()
        except ResponseError:  # e.g. the error reply to CLIENT REPLY itself
            pass


def ring(space_id: int, seq: int) -> None:
    """Tell every streaming process to look at space_id (call after the commit). Never raises, never
    waits for Redis's answer (a send into a connection that died is a lost ring: the feeds' poll
    delivers it, and the next ring reconnects at once; a server that cannot be reached is tried again
    after a back-off, so an outage costs a commit nothing)."""
    with _lock:
        _ring(space_id, seq)


def _ring(space_id: int, seq: int) -> None:
    global _client
    try:
        conn = _connection()
        if conn is None:
            return
        conn.send_command("PUBLISH", f"{prefix()}{space_id}", seq, check_health=False)
        _drain(conn)
    except Exception:
        log.warning("event ring for space %s seq %s failed; the feeds' poll delivers it", space_id, seq, exc_info=True)
        if _client is not None:
            try:
                _client[1].disconnect()
            except Exception:
                pass
        _client = None  # the next ring reconnects


class Listener:
    """One pattern subscription on an event loop; calls on_ring(space_id, seq) in the loop for each
    ring. A lost connection is re-made with backoff (rings meanwhile are covered by the feeds' poll)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_ring: Callable[[int, int], None]) -> None:
        self.loop, self.on_ring = loop, on_ring  # held: a loop's id is its key, and is not reused while it lives
        self.name = client_name("listen")  # every subscription this listener makes carries it
        self.subscribed = asyncio.Event()
        self.task = loop.create_task(self._run())

    async def _run(self) -> None:
        import redis.asyncio as aioredis

        pattern, backoff = f"{prefix()}*", 0.2
        while True:
            client = aioredis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=SOCKET_TIMEOUT, client_name=self.name)
            try:
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                await pubsub.psubscribe(pattern)
                self.subscribed.set()
                backoff = 0.2
                async for message in pubsub.listen():
                    self._dispatch(message)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.info("event doorbell subscription lost; re-subscribing in %.1f s", backoff, exc_info=True)
            finally:
                self.subscribed.clear()
                try:
                    await client.aclose()
                except Exception:
                    pass
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    def _dispatch(self, message: dict) -> None:
        if message.get("type") != "pmessage":
            return
        space, seq = message.get("channel", b"")[len(prefix()):], message.get("data", b"")
        if space.isdigit() and seq.isdigit():
            self.on_ring(int(space), int(seq))

    def close(self) -> None:
        self.task.cancel()
