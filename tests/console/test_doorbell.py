"""The cross-process doorbell: a commit in another process rings this process's open sockets.

Embedded mode rings through veronica.plumbing.doorbell (datagram sockets beside the SQLite file), hosted
mode through Redis pub/sub (veronica.plumbing.redisbell). Either way the poll is not what delivers: these tests set it to an
hour, so only a ring can bring the event within the (generous) timeout.
"""
from __future__ import annotations

import asyncio
import socket as pysocket
import sys

import pytest

from tests.console.servers import server_env
from tests.console.test_socket import head, receive_events, run, socket, until_ready
from tests.console.test_socket import world  # noqa: F401  (the fixture)
from veronica.web import consumers
from veronica.swarm import access
from veronica.plumbing import doorbell

PRODUCER = """
import sys
import django
django.setup()
from veronica.swarm import events
space_id, count = int(sys.argv[1]), int(sys.argv[2])
for i in range(count):
    events.emit(space_id, "bell.tick", n=i)
sys.stdin.read()  # stay up until the test has its events
"""


def test_a_commit_in_another_process_reaches_an_open_socket_without_the_poll(world, monkeypatch):
    monkeypatch.setattr(consumers, "POLL_SECONDS", 3600.0)
    start, env = head(world.space), server_env()
    _, key = access.create_token(world.viewer, "doorbell test")

    async def scenario():
        comm = socket("alpha", after=start, headers=[(b"authorization", f"Bearer {key}".encode())])
        assert (await comm.connect())[0]
        await until_ready(comm)
        producer = await asyncio.create_subprocess_exec(sys.executable, "-c", PRODUCER, str(world.space.pk), "3", env=env,
                                                        stdin=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            got = await receive_events(comm, 3, timeout=30)
        finally:
            _, err = await producer.communicate(b"")
        assert producer.returncode == 0, err.decode()[-2000:]
        assert [e["seq"] for e in got] == [start + 1, start + 2, start + 3]
        assert [e["payload"]["n"] for e in got] == [0, 1, 2]
        await comm.disconnect()

    run(scenario)


def test_a_ring_reaches_every_listener_and_clears_a_dead_processs_socket(tmp_path, monkeypatch):
    monkeypatch.setattr(doorbell, "directory", lambda: tmp_path / "bell")
    loop = asyncio.new_event_loop()
    heard: list[tuple[int, int]] = []
    listener = doorbell.Listener(loop, lambda space_id, seq: heard.append((space_id, seq)))
    dead = pysocket.socket(pysocket.AF_UNIX, pysocket.SOCK_DGRAM)  # bound, then its process "dies"
    dead_path = tmp_path / "bell" / f"1-dead{doorbell.SUFFIX}"
    dead.bind(str(dead_path))
    dead.close()
    try:
        doorbell.ring(7, 42)
        loop.run_until_complete(asyncio.sleep(0.2))
        assert heard == [(7, 42)]
        assert not dead_path.exists()
    finally:
        listener.close()
        loop.close()
    assert not list((tmp_path / "bell").iterdir())  # a closed listener leaves no socket behind
    doorbell.ring(7, 43)  # nobody listening: a no-op, not an error


def test_a_ring_without_a_doorbell_directory_is_a_no_op(tmp_path, monkeypatch):
    monkeypatch.setattr(doorbell, "directory", lambda: tmp_path / "never-created")
    doorbell.ring(1, 1)
    assert not (tmp_path / "never-created").exists()


@pytest.mark.parametrize("garbage", [b"", b"x:1", b"1:", b"1:2:3", b"\xff" * 64])
def test_a_malformed_datagram_is_ignored(tmp_path, monkeypatch, garbage):
    monkeypatch.setattr(doorbell, "directory", lambda: tmp_path / "bell")
    loop = asyncio.new_event_loop()
    heard: list[tuple[int, int]] = []
    listener = doorbell.Listener(loop, lambda space_id, seq: heard.append((space_id, seq)))
    try:
        sender = pysocket.socket(pysocket.AF_UNIX, pysocket.SOCK_DGRAM)
        sender.sendto(garbage, listener.path)
        sender.close()
        doorbell.ring(3, 4)
        loop.run_until_complete(asyncio.sleep(0.2))
        assert heard == [(3, 4)]
    finally:
        listener.close()
        loop.close()


def test_the_doorbell_is_for_an_embedded_database_in_a_file(settings):
    from django.db import connections

    expected = not settings.REDIS_URL and connections["default"].vendor == "sqlite"
    assert doorbell.enabled() is expected  # hosted mode rings through channels-redis instead
    if expected:
        name = connections["default"].settings_dict["NAME"]
        try:
            connections["default"].settings_dict["NAME"] = ":memory:"
            assert not doorbell.enabled()
        finally:
            connections["default"].settings_dict["NAME"] = name
