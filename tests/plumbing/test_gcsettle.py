"""A long-lived process settles its garbage collector once loaded (veronica.plumbing.gcsettle): the
web server after its first request, a worker once warm (tests/engine/test_worker_warmup.py)."""
from __future__ import annotations

import asyncio
import gc
import multiprocessing
import sys

from veronica.plumbing import gcsettle


async def _app(scope, receive, send):
    _app.calls += 1


_app.calls = 0


def _serve_twice(conn) -> None:
    wrapped = gcsettle.SettleOnFirstRequest(_app, enabled=True)
    seen = []
    for _ in range(2):
        asyncio.run(wrapped({"type": "http"}, None, None))
        seen.append((gc.get_threshold(), gc.get_freeze_count() > 10_000))
    conn.send((seen, _app.calls))
    conn.close()


def test_a_server_settles_its_collector_after_its_first_request_only():
    ctx = multiprocessing.get_context("fork")  # not this test process's collector
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=_serve_twice, args=(theirs,))
    child.start()
    seen, calls = ours.recv()
    child.join(timeout=30)
    assert calls == 2, "every request reaches the app"
    assert seen[0] == (gcsettle.THRESHOLD, True), "settled after the first request"
    assert seen[1] == seen[0]


def test_an_app_imported_by_a_test_or_a_shell_leaves_the_collector_alone():
    before = gc.get_threshold(), gc.get_freeze_count()
    asyncio.run(gcsettle.SettleOnFirstRequest(_app, enabled=False)({"type": "http"}, None, None))
    assert (gc.get_threshold(), gc.get_freeze_count()) == before


def test_only_daphne_is_taken_for_the_server(monkeypatch):
    for argv0, serving in (("/srv/.venv/bin/daphne", True), ("/usr/lib/python3/site-packages/daphne/__main__.py", True),
                           ("/srv/.venv/bin/pytest", False), ("manage.py", False), ("", False)):
        monkeypatch.setattr(sys, "argv", [argv0] if argv0 else [])
        assert gcsettle.serving_with_daphne() is serving, argv0
