"""The event stream in-process (channels' WebsocketCommunicator against the real ASGI stack)."""
from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from tests.console.conftest import make_world
from veronica.web import consumers
from veronica.swarm import access, events
from veronica.asgi import application

ORIGIN = (b"origin", b"http://testserver")


@pytest.fixture
def world(transactional_db, tmp_path):
    return make_world(tmp_path)


def cookie_for(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


_cookies: dict[int, bytes] = {}


@pytest.fixture(autouse=True)
def sessions(world):
    """Session cookies are made before the event loop runs (the ORM is sync-only)."""
    _cookies.clear()
    for user in (world.viewer, world.operator, world.stranger, world.staff):
        _cookies[user.pk] = cookie_for(user)


def socket(slug: str, *, user=None, after: int | None = None, headers: list | None = None) -> WebsocketCommunicator:
    path = f"/ws/spaces/{slug}/" + (f"?after={after}" if after is not None else "")
    hdrs = [ORIGIN] + (headers or [])
    if user is not None:
        hdrs.append((b"cookie", _cookies[user.pk]))
    return WebsocketCommunicator(application, path, headers=hdrs)


emit = sync_to_async(events.emit)


def run(scenario) -> None:
    """Run a scenario, then let the feeds stop by themselves (their channel-layer listeners end
    cooperatively; asyncio.run would cancel them mid-read instead)."""
    async def main():
        await scenario()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while loop.time() < deadline and any(t is not asyncio.current_task() for t in asyncio.all_tasks()):
            await asyncio.sleep(0.05)

    asyncio.run(main())


def head(space) -> int:
    return type(space).objects.get(pk=space.pk).event_seq


async def receive_events(comm: WebsocketCommunicator, count: int, timeout: float = 3) -> list[dict]:
    got = []
    while len(got) < count:
        msg = await comm.receive_json_from(timeout=timeout)
        if msg["type"] == "event":
            got.append(msg)
    return got


async def until_ready(comm: WebsocketCommunicator) -> tuple[list[dict], int]:
    got = []
    while True:
        msg = await comm.receive_json_from(timeout=3)
        if msg["type"] == "ready":
            return got, msg["seq"]
        got.append(msg)


def test_replays_every_event_after_the_clients_seq_then_says_ready(world):
    start = head(world.space)

    async def scenario():
        for i in range(5):
            await emit(world.space.pk, "test.tick", n=i)
        comm = socket("alpha", user=world.viewer, after=start + 2)
        connected, _ = await comm.connect()
        assert connected
        replayed, ready_seq = await until_ready(comm)
        assert [e["seq"] for e in replayed] == [start + 3, start + 4, start + 5]
        assert replayed[0]["kind"] == "test.tick" and replayed[0]["payload"] == {"n": 2} and ready_seq == start + 5
        await comm.disconnect()

    run(scenario)


def test_streams_live_events_in_order_without_repeats(world):
    base = head(world.space)

    async def scenario():
        comm = socket("alpha", user=world.viewer, after=base)
        assert (await comm.connect())[0]
        await until_ready(comm)
        for i in range(20):
            await emit(world.space.pk, "test.live", n=i)
        got = await receive_events(comm, 20)
        assert [e["seq"] for e in got] == list(range(base + 1, base + 21))
        assert await comm.receive_nothing(timeout=0.8)  # a later poll repeats nothing
        await comm.disconnect()

    run(scenario)


def test_an_event_that_never_rang_arrives_through_the_poll(world, monkeypatch):
    monkeypatch.setattr(events, "ring", lambda space_id, seq: None)  # as from a worker process
    monkeypatch.setattr(consumers, "POLL_SECONDS", 0.3)
    start = head(world.space)

    async def scenario():
        comm = socket("alpha", user=world.viewer, after=start)
        assert (await comm.connect())[0]
        await until_ready(comm)
        event = await emit(world.space.pk, "test.silent")
        got = await receive_events(comm, 1, timeout=consumers.POLL_SECONDS * 4)
        assert got[0]["seq"] == event.seq
        await comm.disconnect()

    run(scenario)


def test_a_reconnect_with_the_last_seq_resumes_exactly(world):
    start = head(world.space)

    async def scenario():
        comm = socket("alpha", user=world.operator, after=start)
        assert (await comm.connect())[0]
        await until_ready(comm)
        for i in range(3):
            await emit(world.space.pk, "test.a", n=i)
        first = await receive_events(comm, 3)
        await comm.disconnect()
        for i in range(4):  # produced while disconnected
            await emit(world.space.pk, "test.b", n=i)
        again = socket("alpha", user=world.operator, after=first[-1]["seq"])
        assert (await again.connect())[0]
        replayed, _ = await until_ready(again)
        await emit(world.space.pk, "test.c")
        live = await receive_events(again, 1)
        seqs = [e["seq"] for e in first + replayed + live]
        assert seqs == list(range(start + 1, start + 9))
        await again.disconnect()

    run(scenario)


def test_other_spaces_users_anonymous_and_bad_input_are_refused(world):
    async def scenario():
        for comm, code in [(socket("alpha", user=world.stranger), 4404), (socket("nope", user=world.staff), 4404),
                           (socket("alpha"), 4401)]:
            assert (await comm.connect()) == (False, code)
        no_origin = WebsocketCommunicator(application, "/ws/spaces/alpha/", headers=[(b"cookie", _cookies[world.viewer.pk])])
        assert not (await no_origin.connect())[0]
        bad = WebsocketCommunicator(application, "/ws/spaces/alpha/?after=-3", headers=[ORIGIN, (b"cookie", _cookies[world.viewer.pk])])
        assert (await bad.connect()) == (False, 4400)
        evil_origin = WebsocketCommunicator(application, "/ws/spaces/alpha/", headers=[(b"origin", b"http://evil.example"),
                                            (b"cookie", _cookies[world.viewer.pk])])
        assert not (await evil_origin.connect())[0]

    run(scenario)


def test_a_bearer_token_opens_the_stream_for_scripts(world):
    _, key = access.create_token(world.viewer, "script")

    async def scenario():
        comm = socket("alpha", headers=[(b"authorization", f"Bearer {key}".encode())])
        assert (await comm.connect())[0]
        await until_ready(comm)
        await comm.disconnect()
        refused = socket("beta", headers=[(b"authorization", f"Bearer {key}".encode())])
        assert (await refused.connect()) == (False, 4404)

    run(scenario)


def test_the_stream_is_read_only_and_answers_pings(world):
    start = head(world.space)

    async def scenario():
        comm = socket("alpha", user=world.operator, after=start)
        assert (await comm.connect())[0]
        await until_ready(comm)
        await comm.send_json_to({"type": "ping"})
        assert (await comm.receive_json_from())["type"] == "pong"
        await comm.send_json_to({"type": "approve", "id": 1})
        assert "read-only" in (await comm.receive_json_from())["error"]
        await comm.disconnect()

    run(scenario)


def test_revoking_access_closes_an_open_stream(world, monkeypatch):
    monkeypatch.setattr(consumers, "RECHECK_SECONDS", 0.2)
    monkeypatch.setattr(consumers, "POLL_SECONDS", 0.3)

    start = head(world.space)

    async def scenario():
        comm = socket("alpha", user=world.viewer, after=start)
        assert (await comm.connect())[0]
        await until_ready(comm)
        await sync_to_async(access.revoke)(world.space, "viewer", actor="test")
        while True:
            out = await comm.receive_output(timeout=consumers.POLL_SECONDS * 3)
            if out["type"] == "websocket.close":
                assert out["code"] == 4404
                break

    run(scenario)


def test_one_feed_serves_many_sockets_of_a_space(world):
    start = head(world.space)

    async def scenario():
        comms = [socket("alpha", user=world.viewer, after=start) for _ in range(5)]
        for comm in comms:
            assert (await comm.connect())[0]
            await until_ready(comm)
        assert len([f for f in consumers.Feed._feeds.values() if f.space_id == world.space.pk]) == 1
        event = await emit(world.space.pk, "test.fanout")
        for comm in comms:
            assert (await receive_events(comm, 1))[0]["seq"] == event.seq
        await asyncio.gather(*(comm.disconnect() for comm in comms))
        await asyncio.sleep(0.1)
        assert not [f for f in consumers.Feed._feeds.values() if f.space_id == world.space.pk]

    run(scenario)


def test_an_idle_stream_stays_open_and_still_rings(world):
    """Longer than the Redis layer's 5 s blocking read: the socket must neither die nor go deaf."""
    start = head(world.space)
    idle = 6.5 if settings.REDIS_URL else 1.0  # the in-memory layer has no read timeout to outlast

    async def scenario():
        comm = socket("alpha", user=world.viewer, after=start)
        assert (await comm.connect())[0]
        await until_ready(comm)
        assert await comm.receive_nothing(timeout=idle, interval=0.5)
        event = await emit(world.space.pk, "test.after-idle")
        got = await receive_events(comm, 1, timeout=consumers.POLL_SECONDS + 1)
        assert got[0]["seq"] == event.seq
        await comm.disconnect()

    run(scenario)


# --- credentials end while a socket is open (issue 9 item 3) ---------------------------------------

async def closed_with(comm: WebsocketCommunicator) -> int:
    """The close code, within a few poll periods (events before it are skipped)."""
    while True:
        out = await comm.receive_output(timeout=consumers.POLL_SECONDS * 4)
        if out["type"] == "websocket.close":
            return out["code"]


@pytest.fixture
def fast_recheck(monkeypatch):
    monkeypatch.setattr(consumers, "RECHECK_SECONDS", 0.2)
    monkeypatch.setattr(consumers, "POLL_SECONDS", 0.3)


def bearer(key: str) -> list:
    return [(b"authorization", f"Bearer {key}".encode())]


def test_revoking_a_token_closes_its_socket_with_4401(world, fast_recheck):
    token, key = access.create_token(world.viewer, "script")
    _, other_key = access.create_token(world.viewer, "other script")

    async def scenario():
        doomed, kept = socket("alpha", headers=bearer(key)), socket("alpha", headers=bearer(other_key))
        for comm in (doomed, kept):
            assert (await comm.connect())[0]
            await until_ready(comm)
        await sync_to_async(access.revoke_token)(world.viewer, token.pk)
        assert await closed_with(doomed) == 4401
        await kept.send_json_to({"type": "ping"})
        assert (await kept.receive_json_from())["type"] == "pong"  # the other token's socket lives on
        await kept.disconnect()

    run(scenario)


def test_logging_out_closes_the_session_socket_with_4401(world, fast_recheck):
    def log_out(user):
        client = Client()
        client.cookies["sessionid"] = _cookies[user.pk].decode().split("=", 1)[1]
        assert client.post("/logout/").status_code == 302

    async def scenario():
        mine, theirs = socket("alpha", user=world.viewer), socket("alpha", user=world.operator)
        for comm in (mine, theirs):
            assert (await comm.connect())[0]
            await until_ready(comm)
        await sync_to_async(log_out)(world.viewer)
        assert await closed_with(mine) == 4401
        assert await theirs.receive_nothing(timeout=consumers.POLL_SECONDS * 3)
        await theirs.disconnect()

    run(scenario)


def test_logging_out_closes_the_socket_at_once_not_at_the_next_periodic_recheck(world, monkeypatch):
    """Logout rings the person's spaces with seq 0 (events.RECHECK_RING): the feed re-checks now.
    The periodic re-check is an hour away here, so only that ring can close the socket."""
    monkeypatch.setattr(consumers, "RECHECK_SECONDS", 3600)

    def log_out(user):
        client = Client()
        client.cookies["sessionid"] = _cookies[user.pk].decode().split("=", 1)[1]
        assert client.post("/logout/").status_code == 302

    async def scenario():
        mine = socket("alpha", user=world.viewer)
        assert (await mine.connect())[0]
        await until_ready(mine)
        # hosted: a ring is at-most-once, so wait (on the condition, not a clock) until this loop's Redis
        # subscription is live; embedded rings through the in-memory layer and the doorbell at once
        listener = consumers._Doorbells._listeners.get(id(asyncio.get_running_loop()))
        if getattr(listener, "subscribed", None) is not None:
            await asyncio.wait_for(listener.subscribed.wait(), 60)
        await sync_to_async(log_out)(world.viewer)
        assert await closed_with(mine) == 4401

    run(scenario)


def test_the_logout_ring_goes_out_only_once_the_session_is_gone(world, monkeypatch):
    """Django sends user_logged_out before it flushes the session: a ring sent then could be heard and
    the re-check run while the session still stands, and the socket would stay open for an hour."""
    from django.contrib.sessions.models import Session

    key = _cookies[world.viewer.pk].decode().split("=", 1)[1]
    rung: list[tuple[int, int, bool]] = []
    monkeypatch.setattr(events, "ring", lambda space_id, seq: rung.append(
        (space_id, seq, Session.objects.filter(session_key=key).exists())))
    client = Client()
    client.cookies["sessionid"] = key
    assert client.post("/logout/").status_code == 302
    assert rung == [(world.space.pk, events.RECHECK_RING, False)]


def test_switching_local_passwords_off_closes_the_sockets_of_password_sessions(world, fast_recheck, settings):
    """VERONICA_LOCAL_PASSWORDS=0 ends sessions a password opened (veronica.web.sso); their sockets too."""
    async def scenario():
        mine = socket("alpha", user=world.viewer)
        assert (await mine.connect())[0]
        await until_ready(mine)
        settings.LOCAL_PASSWORDS = False
        assert await closed_with(mine) == 4401

    run(scenario)


def test_a_password_change_or_a_disabled_user_closes_the_socket(world, fast_recheck):
    def change_password(user):
        user.set_password("a new one entirely")
        user.save()

    def disable(user):
        type(user).objects.filter(pk=user.pk).update(is_active=False)

    async def scenario():
        moved, disabled = socket("alpha", user=world.viewer), socket("alpha", user=world.operator)
        for comm in (moved, disabled):
            assert (await comm.connect())[0]
            await until_ready(comm)
        await sync_to_async(change_password)(world.viewer)  # the session's auth hash no longer matches
        await sync_to_async(disable)(world.operator)
        assert await closed_with(moved) == 4401
        assert await closed_with(disabled) == 4401

    run(scenario)


def test_a_bearer_token_needs_no_origin_but_a_cookie_does(world):
    _, key = access.create_token(world.viewer, "script")
    cookie = (b"cookie", _cookies[world.viewer.pk])

    async def scenario():
        script = WebsocketCommunicator(application, "/ws/spaces/alpha/", headers=bearer(key))  # no Origin at all
        assert (await script.connect())[0]
        await until_ready(script)
        await script.disconnect()
        browser = WebsocketCommunicator(application, "/ws/spaces/alpha/", headers=[cookie])
        assert not (await browser.connect())[0]
        # an Authorization header decides alone: a bad token never falls back to the cookie
        forged = WebsocketCommunicator(application, "/ws/spaces/alpha/", headers=[cookie, *bearer("vrn_not-a-token")])
        assert (await forged.connect()) == (False, 4401)
        basic = WebsocketCommunicator(application, "/ws/spaces/alpha/", headers=[cookie, (b"authorization", b"Basic dTpw")])
        assert (await basic.connect()) == (False, 4401)

    run(scenario)


def test_a_frame_that_is_not_json_gets_an_error_frame_and_the_socket_stays_open(world):
    async def scenario():
        comm = socket("alpha", user=world.viewer)
        assert (await comm.connect())[0]
        await until_ready(comm)
        for frame in ("not json", "[" * 100000, "{"):
            await comm.send_to(text_data=frame)
            answer = await comm.receive_json_from()
            assert answer["type"] == "error" and answer["field"] == "frame", frame[:10]
        await comm.send_to(bytes_data=b"\x00\x01")
        assert "binary" in (await comm.receive_json_from())["error"]
        await comm.send_json_to({"type": "ping"})
        assert (await comm.receive_json_from())["type"] == "pong"
        await comm.disconnect()

    run(scenario)
