"""The route cache loads a space's routes once when many runs miss it together (waggle.routecache)."""
from __future__ import annotations

import threading
import time

import pytest

from waggle import routecache


@pytest.fixture(autouse=True)
def fresh_cache():
    routecache.changed()
    yield
    routecache.changed()


def together(n: int, call) -> list:
    """call() on n threads released at once; their results."""
    start, results = threading.Barrier(n), [None] * n

    def body(i: int) -> None:
        start.wait()
        results[i] = call()
    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return results


def slow_load(loads: list, rows=("r",), pause: float = 0.05, fail: bool = False):
    def load(space_key: str) -> list:
        loads.append(space_key)
        time.sleep(pause)  # the read, while the other runs of the burst ask
        if fail:
            raise RuntimeError("the read failed")
        return list(rows)
    return load


def test_runs_that_miss_together_load_the_spaces_routes_once():
    loads: list = []
    got = together(20, lambda: routecache.routes("s1", slow_load(loads)))
    assert loads == ["s1"] and got == [["r"]] * 20
    assert len({id(routes) for routes in got}) == 20  # each its own list
    together(5, lambda: routecache.routes("s2", slow_load(loads)))
    assert loads == ["s1", "s2"]  # one load per space


def test_waiters_load_on_their_own_when_the_load_they_waited_for_kept_nothing():
    loads: list = []
    load = slow_load(loads, fail=True)

    def ask():
        try:
            return routecache.routes("s1", load)
        except RuntimeError:
            return "failed"
    assert together(4, ask) == ["failed"] * 4 and len(loads) == 4  # nothing kept: each read for itself
    loads.clear()

    def changing(space_key: str) -> list:  # a route written in this process while the first load ran
        loads.append(space_key)
        if len(loads) == 1:
            time.sleep(0.05)
            routecache.changed()
        return ["r"]
    assert together(3, lambda: routecache.routes("s1", changing)) == [["r"]] * 3
    assert 2 <= len(loads) <= 3  # the first load's rows were not kept: the waiters read again


def test_a_caller_with_an_uncommitted_route_write_neither_joins_nor_keeps(monkeypatch):
    loads: list = []
    assert routecache.routes("s1", slow_load(loads, rows=("mine",)), keep=False) == ["mine"]
    assert routecache.routes("s1", slow_load(loads)) == ["r"] and loads == ["s1", "s1"]


def test_a_wait_is_bounded_when_the_load_is_stuck(monkeypatch):
    monkeypatch.setattr(routecache, "LOAD_WAIT", 0.05)
    loads: list = []
    stuck = threading.Event()

    def load(space_key: str) -> list:
        loads.append(space_key)
        if len(loads) == 1:
            stuck.wait(5)  # e.g. queued for a pooled connection the waiters hold
        return ["r"]
    first = threading.Thread(target=lambda: routecache.routes("s1", load))
    first.start()
    while not loads:
        time.sleep(0.001)
    began = time.monotonic()
    assert routecache.routes("s1", load) == ["r"] and len(loads) == 2
    assert time.monotonic() - began < 2
    stuck.set()
    first.join(5)
