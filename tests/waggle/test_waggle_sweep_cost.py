"""Issue 24 point 6: a steady-state sweep reads only the calls that came since the last one.

Counted in rows fetched and statements sent, never in time (the host is loaded)."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from waggle import service, sweeping, window
from waggle.config import WaggleConfig
from waggle.models import ForageCall, Waggle
from waggle_helpers import feed, noise, routine

pytestmark = pytest.mark.django_db


def big_cfg(**kw):
    # a sweep only when asked (a huge mine period), a window of 200 calls, retention the same
    return WaggleConfig(mine_period=10 ** 6, min_len=2, max_len=6, k=3, min_prefix=2,
                        mine_window=200, retention_calls=200, **kw)


def fill(cfg, n_sessions=12, start=0):
    for s in range(start, start + n_sessions):
        feed("1", f"s{s}", routine(f"m{s % 5}") + noise(s), cfg)


def foragecall_selects(ctx) -> list[str]:
    return [q["sql"] for q in ctx.captured_queries
            if "waggle_foragecall" in q["sql"] and q["sql"].lstrip().upper().startswith("SELECT")]


def test_a_steady_state_sweep_reads_only_new_calls():
    cfg = big_cfg()
    fill(cfg, 40)  # 240 calls: the window (200) is full
    while service.sweep("1", config=cfg) is not None:
        pass
    held = window.window("1", 200)
    before = held.rows_read
    fill(cfg, 2, start=40)  # 12 new calls
    with CaptureQueriesContext(connection) as ctx:
        service.sweep("1", config=cfg)
    assert held.rows_read - before == 12  # not the window's 200
    assert len(foragecall_selects(ctx)) == 1  # one query: the new rows and the anchor
    # and nothing new: nothing read
    before = held.rows_read
    with CaptureQueriesContext(connection) as ctx:
        service.sweep("1", config=cfg)
    assert held.rows_read == before and len(foragecall_selects(ctx)) == 1


def test_the_held_window_is_the_window_a_fresh_read_gives():
    cfg = big_cfg()
    fill(cfg, 30)
    service.sweep("1", config=cfg)
    fill(cfg, 9, start=30)
    service.sweep("1", config=cfg)
    held = [(s, q, c) for s, q, c, _ in window.window("1", 200).rows.values()]
    window.forget()
    fresh = [(s, q, c) for s, q, c, _ in window.window("1", 200).rows.values()]
    assert held == fresh and len(fresh) == 200
    # retention kept the newest 200 rows, the window holds exactly those
    assert ForageCall.objects.filter(space_key="1").count() == 200


def test_a_held_window_whose_newest_row_is_gone_is_read_again():
    cfg = big_cfg()
    fill(cfg, 5)
    service.sweep("1", config=cfg)
    held = window.window("1", 200)
    ForageCall.objects.filter(space_key="1").delete()  # as a rolled-back transaction or a purge would
    feed("1", "t", [("read_file", {"path": "only"})], cfg)
    assert [c.tool for _, _, c, _ in window.window("1", 200).rows.values()] == ["read_file"]
    assert window.window("1", 200) is held  # (the same window object, read anew)


def test_a_call_that_commits_after_a_later_one_is_picked_up():
    cfg = big_cfg()
    fill(cfg, 3)
    held = window.window("1", 200)
    feed("1", "late", [("grep", {"path": "a"})], cfg)
    feed("1", "later", [("grep", {"path": "b"})], cfg)
    late = ForageCall.objects.get(session_key="late")
    row = {f.attname: getattr(late, f.attname) for f in ForageCall._meta.concrete_fields}
    late.delete()  # not committed yet when the window is refreshed
    held.refresh("1")
    assert "late" not in {s for s, *_ in held.rows.values()}
    ForageCall.objects.create(**row)  # commits now, under its earlier id
    held.refresh("1")
    sessions = [s for s, *_ in held.rows.values()]
    assert sessions[-2:] == ["late", "later"]


def test_a_judged_shape_is_not_judged_again_until_its_count_grows(monkeypatch):
    cfg = big_cfg(min_contexts=1000)  # every route is judged and turned down
    fill(cfg, 20)
    judged = []
    real = service.promotable
    monkeypatch.setattr(sweeping, "promotable", lambda cand, *a, **k: judged.append(cand.shape) or real(cand, *a, **k))
    assert service.sweep("1", config=cfg) is None and judged
    judged.clear()
    feed("1", "other", [("stat", {"path": "q"})], cfg)  # news that changes no mined count
    service.sweep("1", config=cfg)
    assert judged == []
    window.forget()  # a new process: it judges them once
    service.sweep("1", config=cfg)
    assert judged


# --- the inbound miner (messages and calls) reads only the sessions that changed ------------------
USERS = ["mia_li_3668", "noah_smith_1234", "ava_kim_2020", "liam_wu_7781", "emma_roy_4410", "omar_haddad_9001",
         "zoe_park_5150", "ivan_ross_6262"]


def support_session(i: int) -> list:
    """A user says who they are and names a reservation their record lists; the agent looks both up."""
    import json

    from waggle.inbound import message_call
    from waggle.trace import Call

    user, res = USERS[i % len(USERS)] + ("" if i < len(USERS) else str(i)), f"R{i:03d}XZ"
    return [message_call(f"I am {user}."),
            Call.make("get_user_details", {"user_id": user}, output=json.dumps({"reservations": ["ZZ9ZZ9", res]})),
            message_call(f"Please check reservation {res}."),
            Call.make("get_reservation_details", {"reservation_id": res}, output=json.dumps({"id": res}))]


def count_reads(monkeypatch) -> list:
    from waggle import inbound

    read = []
    real = inbound._sightings
    monkeypatch.setattr(inbound, "_sightings", lambda seg: read.append(len(seg)) or real(seg))
    return read


def test_the_inbound_miner_with_a_memo_mines_what_a_fresh_read_mines_and_reads_only_changed_sessions(monkeypatch):
    from waggle.inbound import HeardMemo, mine_heard
    from waggle.route import wilson_lower

    read = count_reads(monkeypatch)
    memo = HeardMemo()
    sessions = {i: support_session(i) for i in range(10)}

    def both():
        keys = sorted(sessions)
        segs = [sessions[k] for k in keys]
        fresh = mine_heard(segs, min_contexts=3, min_confidence=0.5, z=1.0, wilson=wilson_lower)
        read.clear()
        kept = mine_heard(segs, min_contexts=3, min_confidence=0.5, z=1.0, wilson=wilson_lower,
                          keys=[(k, len(sessions[k])) for k in keys], memo=memo)
        assert kept == fresh and fresh
        return len(read)

    assert both() == 10  # the first sweep reads every session
    assert both() == 0   # nothing changed: nothing read
    sessions[10] = support_session(10)
    assert both() == 1   # a new session: only it
    sessions[3] = sessions[3][:2]  # a session that changed (fewer events: the window trimmed it)
    del sessions[0]
    assert both() == 1
    assert set(memo.sightings) == {(k, len(v)) for k, v in sessions.items()}  # (gone sessions are dropped)
    with pytest.raises(ValueError):
        mine_heard([[]], min_contexts=3, min_confidence=0.5, z=1.0, wilson=wilson_lower, keys=[], memo=memo)


def test_a_steady_state_sweep_mines_inbound_routes_from_the_new_sessions_only(monkeypatch):
    from waggle.trace import decode_value

    cfg = big_cfg(min_contexts=3)
    n = 0

    def add(count):
        nonlocal n
        for _ in range(count):
            for c in support_session(n):
                if c.tool == "(inbound message)":
                    service.inbound("1", f"u{n}", "m", " ".join(str(decode_value(v)) for _, v in c.refs), None,
                                    config=cfg)
                else:
                    service.observe("1", f"u{n}", "m", c.tool, {k: decode_value(v) for k, v in c.args}, False,
                                    '{"reservations": ["ZZ9ZZ9", "R%03dXZ"]}' % n, config=cfg)
            n += 1

    add(12)
    while service.sweep("1", config=cfg) is not None:
        pass
    assert Waggle.objects.filter(space_key="1", name__startswith="heard.").exists()
    read = count_reads(monkeypatch)
    add(1)
    service.sweep("1", config=cfg)
    assert read == [4]  # the one new session (its 4 events), not the window's 13
