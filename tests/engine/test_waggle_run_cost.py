"""waggle's share of a run, pinned in statements (issue 25, "a fleet on few hosts"). A run that opens its
member's session sends waggle nothing to read: the session's ring is known empty and no replay of it
can wait (waggle.recording.pinned(new=True)), and the space's routes come from the process's cache
(waggle.routecache). What it writes is the same rows: the wake's message and each call; on PostgreSQL
every one of them rides in its transaction's last statement (the message's in the brief's)."""
from __future__ import annotations

from pathlib import Path

from django.db import connection
from django.test.utils import CaptureQueriesContext

from veronica.swarm import bus
from veronica.engine import runner, supervisor
from waggle.models import ForageCall


def w1(space):
    return supervisor.get_member(space, "w1")


def a_run(space, scripted, text):
    Path(space.workdir, "a.txt").write_text("a\n")
    scripted(("list_dir", {"path": "."}), ("read_file", {"path": "a.txt"}), "done")
    bus.send(space, "boss", "w1", text)
    with CaptureQueriesContext(connection) as queries:
        assert runner.wake(w1(space).pk, "message") == "done"
    return [q["sql"] for q in queries.captured_queries]


def test_a_run_that_opens_the_session_reads_nothing_of_waggle(space, scripted):
    a_run(space, scripted, "warm")  # the space's routes are read once per process (and kept a few seconds)
    _end_session(space)  # the next run opens a new one
    sqls = a_run(space, scripted, "list the folder")
    waggle_reads = [s for s in sqls if s.startswith("SELECT") and '"waggle_' in s]
    assert not waggle_reads, "\n".join(s[:120] for s in waggle_reads)
    writes = [s for s in sqls if '"waggle_' in s and not s.startswith("SELECT")]
    if connection.vendor == "postgresql":  # the message's row and the calls' rows ride in the host's statements
        assert all(s.startswith("WITH") for s in writes), "\n".join(s[:120] for s in writes)
    else:
        assert len(writes) == 3  # the message and two calls
    session = str(w1(space).sessions.order_by("-id").first().pk)
    rows = list(ForageCall.objects.filter(space_key=str(space.pk), session_key=session).order_by("seq")
                .values_list("seq", "tool"))
    assert rows == [(1, "(inbound message)"), (2, "list_dir"), (3, "read_file")]


def _end_session(space):
    from django.utils import timezone

    from veronica.models import Session

    Session.objects.filter(member=w1(space), ended_at__isnull=True).update(ended_at=timezone.now(), end_reason="test")


def test_the_next_run_of_the_session_reads_its_ring_but_not_what_waits(space, scripted):
    a_run(space, scripted, "first")
    sqls = a_run(space, scripted, "second")
    assert len([s for s in sqls if s.startswith("SELECT") and '"waggle_foragecall"' in s]) == 1  # its last seq
    assert not [s for s in sqls if s.startswith("SELECT") and '"waggle_firedplan"' in s]
    assert not [s for s in sqls if s.startswith("SELECT") and '"waggle_waggle"' in s]


def test_a_space_with_an_inbound_route_hears_the_wake_s_message_before_the_brief(space, scripted):
    from waggle import service
    from waggle.config import WaggleConfig

    key, cfg = str(space.pk), WaggleConfig(mine_period=8, min_len=2, max_len=6, k=3, min_prefix=2)
    for i in range(4):  # sessions in which the message names a file and the agent reads it first
        name = f"notes{i}.txt"
        service.inbound(key, f"teach-{i}", "m", f"Hello, please read {name} now.", None, config=cfg)
        service.observe(key, f"teach-{i}", "m", "read_file", {"path": name}, False, f"notes {i}", config=cfg)
        service.observe(key, f"teach-{i}", "m", "write_file", {"path": "x"}, True, "ok", config=cfg)
    learned = service.sweep(key, config=cfg)
    assert learned is not None and learned.name.startswith("heard."), learned
    Path(space.workdir, "notes9.txt").write_text("the ninth notes\n")
    scripted("done")
    bus.send(space, "boss", "w1", "Hello, please read notes9.txt now.")
    assert runner.wake(w1(space).pk, "message") == "done"
    brief = w1(space).sessions.order_by("-id").first().turns.order_by("seq").first().content
    assert "[waggle: replayed" in brief and "the ninth notes" in brief, brief
    session = str(w1(space).sessions.order_by("-id").first().pk)
    assert list(ForageCall.objects.filter(space_key=key, session_key=session).order_by("seq")
                .values_list("tool", "replayed")) == [("(inbound message)", False), ("read_file", True)]
