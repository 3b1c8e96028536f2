"""Issue 24 point 6: a steady-state sweep reads only the calls that came since the last one.

Counted in rows fetched and statements sent, never in time (the host is loaded)."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from waggle import service, sweeping, window
from waggle.config import WaggleConfig
from waggle.models import ForageCall
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
