"""veronica.plumbing.redisbell: the hosted event doorbell is one PUBLISH per ring and one pattern subscription
per event loop; it survives a dropped subscription and never fails or holds the ringing worker."""
from __future__ import annotations

import asyncio
import logging
import time

import pytest
from django.conf import settings

from veronica.plumbing import redisbell
from tests.harness import free_port
from tests.own_names import own_name

pytestmark = pytest.mark.skipif(not settings.REDIS_URL, reason="hosted mode's doorbell (Redis)")


async def heard(rings: list, count: int, timeout: float = 5.0) -> list:
    deadline = time.monotonic() + timeout
    while len(rings) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return rings


@pytest.fixture(autouse=True)
def own_channels(settings):
    """Pub/sub channels are server-wide (no database number): a prefix of this test's own, so it hears
    no other deployment or test run on the same Redis, and they hear nothing of it."""
    settings.CHANNEL_PREFIX = own_name("bell")
    yield settings.CHANNEL_PREFIX


def listen(rings: list):
    loop = asyncio.get_running_loop()
    return redisbell.Listener(loop, lambda space_id, seq: rings.append((space_id, seq)))


def kill_named(name: str) -> int:
    """Drop the connection(s) this test made, found by their own unique name, by id: never another
    client of the Redis the suite is pointed at (another app, another deployment, another test run)."""
    import redis

    admin = redis.Redis.from_url(settings.REDIS_URL)
    try:
        ids = [c["id"] for c in admin.client_list() if c.get("name") == name]
        for client_id in ids:
            admin.client_kill_filter(_id=client_id)
        return len(ids)
    finally:
        admin.close()


def test_a_ring_reaches_the_subscribed_loop():
    async def scenario():
        rings: list = []
        listener = listen(rings)
        await asyncio.wait_for(listener.subscribed.wait(), 5)
        await asyncio.to_thread(redisbell.ring, 7, 41)
        await asyncio.to_thread(redisbell.ring, 8, 42)
        await heard(rings, 2)
        listener.close()
        return rings

    assert asyncio.run(scenario()) == [(7, 41), (8, 42)]


def test_another_deployments_prefix_is_not_heard(settings, own_channels):
    async def scenario():
        rings: list = []
        listener = listen(rings)
        await asyncio.wait_for(listener.subscribed.wait(), 5)
        settings.CHANNEL_PREFIX = f"{own_channels}-someone-else"
        redisbell._client = None
        await asyncio.to_thread(redisbell.ring, 7, 1)
        settings.CHANNEL_PREFIX = own_channels
        await asyncio.to_thread(redisbell.ring, 7, 2)
        await heard(rings, 2, timeout=1.0)
        listener.close()
        return rings

    assert asyncio.run(scenario()) == [(7, 2)]


def test_a_dropped_subscription_is_made_again():
    async def scenario():
        rings: list = []
        listener = listen(rings)
        await asyncio.wait_for(listener.subscribed.wait(), 5)
        assert kill_named(listener.name) == 1  # its subscription, and nobody else's
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # rings until the new subscription hears one
            await asyncio.to_thread(redisbell.ring, 9, 1)
            if rings:
                break
            await asyncio.sleep(0.1)
        listener.close()
        return rings

    assert asyncio.run(scenario())[:1] == [(9, 1)]


@pytest.fixture
def fresh_bell():
    redisbell._client, redisbell._retry_at, redisbell._retry_after = None, 0.0, 0.0
    yield
    redisbell._client, redisbell._retry_at, redisbell._retry_after = None, 0.0, 0.0


def test_a_ring_with_redis_down_neither_raises_nor_hangs(settings, caplog, fresh_bell):
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nobody listens there
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="veronica.plumbing.redisbell"):
        redisbell.ring(1, 1)
    assert time.monotonic() - started < redisbell.SOCKET_TIMEOUT + 1
    assert "Redis unreachable" in caplog.text


def test_an_unreachable_redis_is_retried_after_a_back_off_not_on_every_commit(settings, caplog, monkeypatch, fresh_bell):
    """Each connect to a Redis that is down can take SOCKET_TIMEOUT: a worker must not pay it (or log
    it) on every commit of an outage, and must ring again once Redis is back."""
    import redis

    attempts = []
    real_connect = redis.Connection.connect
    monkeypatch.setattr(redis.Connection, "connect", lambda self: (attempts.append(1), real_connect(self))[1])
    up = settings.REDIS_URL
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    with caplog.at_level(logging.WARNING, logger="veronica.plumbing.redisbell"):
        for seq in range(50):
            redisbell.ring(1, seq)
    assert len(attempts) == 1, "one connect per back-off, not one per ring"
    assert caplog.text.count("Redis unreachable") == 1
    assert redisbell._retry_after == redisbell.RETRY_FIRST

    redisbell._retry_at = 0.0  # the back-off has run out; still down: the wait doubles, quietly
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="veronica.plumbing.redisbell"):
        redisbell.ring(1, 51)
    assert len(attempts) == 2 and redisbell._retry_after == 2 * redisbell.RETRY_FIRST
    assert "unreachable" not in caplog.text, "an outage is logged once, not at every retry"

    settings.REDIS_URL = up  # Redis is back
    redisbell._retry_at = 0.0

    async def scenario():
        rings: list = []
        listener = listen(rings)
        await asyncio.wait_for(listener.subscribed.wait(), 5)
        with caplog.at_level(logging.WARNING, logger="veronica.plumbing.redisbell"):
            await asyncio.to_thread(redisbell.ring, 7, 52)
        await heard(rings, 1)
        listener.close()
        return rings

    assert asyncio.run(scenario()) == [(7, 52)]
    assert "reachable again" in caplog.text and redisbell._retry_after == 0.0


def test_a_ring_is_a_write_with_no_reply_and_survives_a_killed_connection():
    """The ringing connection has replies off (a worker never waits for Redis); when Redis drops it,
    a later ring reconnects (the rings in between are the feeds' poll's to deliver)."""
    async def scenario():
        rings: list = []
        listener = listen(rings)
        await asyncio.wait_for(listener.subscribed.wait(), 5)
        await asyncio.to_thread(redisbell.ring, 4, 1)
        await heard(rings, 1)
        conn = redisbell._client[1]
        conn.send_command("PING", check_health=False)
        assert not conn.can_read(timeout=0.3), "the ringing connection gets no answers: replies are off"
        assert kill_named(conn.client_name) == 1  # the ringing connection, and nobody else's
        deadline = time.monotonic() + 10
        seq = 1  # (4, 1) was heard before the kill: ring on from 2 until a ring after it is heard
        while time.monotonic() < deadline:
            seq += 1
            await asyncio.to_thread(redisbell.ring, 4, seq)
            await asyncio.sleep(0.05)
            if (4, seq) in rings:
                break
        fresh = redisbell._client[1]
        fresh.send_command("PING", check_health=False)
        listener.close()
        return rings, seq, fresh is not conn and not fresh.can_read(timeout=0.3)

    rings, seq, replies_off = asyncio.run(scenario())
    assert (4, seq) in rings and 2 < seq < 10, "the ring just after the kill is lost; one a few rings later is heard"
    assert replies_off, "the ring made a new connection with replies off (a socket redis-py re-opened would answer every ring)"


def test_answers_from_a_server_that_ignored_reply_off_are_drained():
    import redis

    conn = redis.ConnectionPool.from_url(settings.REDIS_URL).make_connection()
    conn.connect()
    conn.send_command("PUBLISH", "nobody:bell:1", 1)  # replies on, as on a server without CLIENT REPLY
    conn.send_command("NO-SUCH-COMMAND")  # an error reply
    deadline = time.monotonic() + 2
    while not conn.can_read(timeout=0) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    redisbell._drain(conn)
    assert not conn.can_read(timeout=0)
    conn.disconnect()


def test_rings_from_many_threads_of_one_worker_all_get_through_and_none_hangs():
    """A worker's many runs (veronica.engine.fleet) ring from their own threads over the process's one
    connection: interleaved writes and drains once left a half-read reply a ring then spun on for good."""
    import threading

    async def scenario():
        rings: list = []
        listener = listen(rings)
        await asyncio.wait_for(listener.subscribed.wait(), 5)
        done = []

        def ringer(n: int) -> None:
            for seq in range(100):
                redisbell.ring(n, seq)
            done.append(n)
        threads = [threading.Thread(target=ringer, args=(n,), daemon=True) for n in range(16)]
        for t in threads:
            t.start()
        await asyncio.to_thread(lambda: [t.join(20) for t in threads])
        await heard(rings, 1600)
        listener.task.cancel()
        return done, rings
    done, rings = asyncio.run(scenario())
    assert len(done) == 16, "a ringing thread hung"
    assert len(rings) == 1600
