"""The stream end to end: a real daphne, events emitted by ANOTHER process, many random disconnects.

Every reconnect passes ?after=<last seq seen>; the union of everything received must be exactly the
produced sequence: nothing lost, nothing repeated, in order.
"""
from __future__ import annotations

import asyncio
import json
import random
import time

from websockets.asyncio.client import connect

from tests.console.conftest import session_cookie
from tests.console.servers import ServerProcess

PRODUCER = """
import random, sys, time
import django
django.setup()
from veronica.swarm import events
space_id, count = int(sys.argv[1]), int(sys.argv[2])
for i in range(count):
    events.emit(space_id, "load.tick", n=i)
    time.sleep(random.uniform(0, 0.006))
print("produced", count)
"""


def ws_url(web: ServerProcess, slug: str, after: int) -> str:
    return web.url.replace("http://", "ws://") + f"/ws/spaces/{slug}/?after={after}"


async def follow(web: ServerProcess, cookie: str, slug: str, start: int, until: int, producer: ServerProcess) -> tuple[list[int], int]:
    """Read the stream with random disconnects until `until` has arrived; returns (seqs, reconnects)."""
    rng = random.Random(4)
    seen: list[int] = []
    last, reconnects = start, 0
    deadline = time.monotonic() + 60
    while last < until and time.monotonic() < deadline:
        async with connect(ws_url(web, slug, last), origin=web.url, additional_headers={"Cookie": f"sessionid={cookie}"},
                           proxy=None, open_timeout=5) as ws:
            stay = rng.uniform(0.0, 0.08) if producer.proc.poll() is None else 5.0
            leave_at = time.monotonic() + stay
            try:
                while time.monotonic() < leave_at and last < until:
                    raw = await asyncio.wait_for(ws.recv(), timeout=max(0.01, leave_at - time.monotonic()))
                    msg = json.loads(raw)
                    if msg["type"] == "event":
                        seen.append(msg["seq"])
                        last = msg["seq"]
            except asyncio.TimeoutError:
                pass
            if rng.random() < 0.5:
                ws.transport.abort()  # a dropped connection, not a polite close
        reconnects += 1
    return seen, reconnects


def test_reconnects_neither_lose_nor_repeat_events_from_another_process(live_world, live_env, live_web):
    space = live_world.space
    cookie = session_cookie(live_world.viewer)
    start = type(space).objects.get(pk=space.pk).event_seq
    count = 300
    with ServerProcess.python(PRODUCER, live_env, str(space.pk), str(count), name="producer") as producer:
        seen, reconnects = asyncio.run(follow(live_web, cookie, "alpha", start, start + count, producer))
        assert producer.wait(30) == 0, producer.output()
    assert seen == list(range(start + 1, start + count + 1))
    print(f"{reconnects} reconnects")
    assert reconnects >= 10


def test_a_stranger_is_refused_by_the_real_server(live_world, live_web):
    cookie = session_cookie(live_world.stranger)

    async def attempt() -> str:
        try:
            async with connect(ws_url(live_web, "alpha", 0), origin=live_web.url, additional_headers={"Cookie": f"sessionid={cookie}"},
                               proxy=None, open_timeout=5):
                return "accepted"
        except Exception as exc:  # daphne answers a close-before-accept with HTTP 403
            return type(exc).__name__ + str(exc)

    outcome = asyncio.run(attempt())
    assert outcome != "accepted" and "403" in outcome
