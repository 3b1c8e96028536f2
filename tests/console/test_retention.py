"""Retention: the tick and `manage.py vacuum` purge only what is older than the space's window and
never unread mail, open tasks, pending approvals, open sessions or the newest N events; the rest
of the event log stays gapless, and the stream / API say where a purged range ends."""
from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from tests.console.conftest import make_world
from tests.console.helpers import call
from tests.console.test_socket import ORIGIN, cookie_for, run, until_ready
from veronica.swarm import bus, events, ledger
from veronica.asgi import application
from veronica.engine import retention, supervisor, tick
from veronica.models import Approval, Event, Message, Run, Session, Space, Task, Wake

OLD = timezone.now() - timedelta(days=40)


@pytest.fixture(autouse=True)
def purge_on_every_tick(settings):
    """The tick purges once a minute per process; these tests tick many times in a row."""
    settings.RETENTION_EVERY_SECONDS = 0


def age(qs) -> None:
    """Backdate rows as if they were made 40 days ago (every date column a kind is judged by)."""
    fields = {f.name for f in qs.model._meta.concrete_fields}
    qs.update(**{f: OLD for f in ("created_at", "updated_at", "ended_at", "finished_at") if f in fields})


def old_history(space: Space) -> dict:
    """A month-old history with something of every kind to purge and every kind to keep."""
    w1, w2 = (supervisor.get_member(space, n) for n in ("w1", "w2"))
    read = bus.send(space, "boss", "w1", "read and old")[0]
    bus.mark_read(w1, [read.pk])
    unread = bus.send(space, "boss", "w2", "unread and old")[0]
    done = ledger.create_task(space, "boss", "finished long ago", assignee=w1)
    Task.objects.filter(pk=done.pk).update(status="done")
    open_task = ledger.create_task(space, "boss", "still open", assignee=w2)
    pending = Approval.objects.create(space=space, member=w1, tool_name="write_file", tool_args={}, status="pending")
    decided = Approval.objects.create(space=space, member=w1, tool_name="write_file", tool_args={}, status="denied", consumed=True)
    ended = Session.objects.create(member=w1, ended_at=OLD)
    open_session = Session.objects.create(member=w2)
    run_row = Run.objects.create(member=w1, source="message", lease_token="t", started_at=OLD, ended_at=OLD, outcome="done")
    Wake.objects.create(member=w1, source="message", claimed=True)
    for i in range(30):
        events.emit(space.pk, "test.old", n=i)
    for model in (Message, Task, Approval, Wake, Event):
        age(model.objects.filter(**({"member__space": space} if model is Wake else {"space": space})))
    Session.objects.filter(pk=ended.pk).update(ended_at=OLD)
    age(Session.objects.filter(pk=open_session.pk))  # started long ago, still open: kept
    Session.objects.filter(pk=open_session.pk).update(ended_at=None)
    return {"read": read, "unread": unread, "done": done, "open_task": open_task, "pending": pending, "decided": decided,
            "ended": ended, "open_session": open_session, "run": run_row}


@pytest.fixture
def aged(world, settings):
    settings.RETENTION_KEEP_EVENTS = 5
    settings.RETENTION_BATCH = 7  # several batches, so batching is exercised
    rows = old_history(world.space)
    Space.objects.filter(pk=world.space.pk).update(retention_days=30)
    world.space.refresh_from_db()
    return rows


def kept(rows: dict) -> dict[str, bool]:
    models = {"read": Message, "unread": Message, "done": Task, "open_task": Task, "pending": Approval, "decided": Approval,
              "ended": Session, "open_session": Session, "run": Run}
    return {name: models[name].objects.filter(pk=row.pk).exists() for name, row in rows.items()}


def seqs(space: Space) -> list[int]:
    return list(Event.objects.filter(space=space).order_by("seq").values_list("seq", flat=True))


def test_vacuum_dry_run_prints_and_deletes_nothing_then_vacuum_purges_only_the_old_and_closed(world, aged):
    before = seqs(world.space)
    out = StringIO()
    call_command("vacuum", "--dry-run", "--space", "alpha", stdout=out)
    assert "alpha: would remove 1 messages, 1 approvals" in out.getvalue() and "1 sessions, 1 tasks" in out.getvalue()
    assert seqs(world.space) == before and all(kept(aged).values())

    out = StringIO()
    call_command("vacuum", stdout=out)
    text = out.getvalue()
    assert "alpha: removed 1 messages, 1 approvals, 0 questions, 1 wakes, 1 runs, 1 sessions, 1 tasks" in text, text
    assert "beta: retention off" in text
    assert kept(aged) == {"read": False, "unread": True, "done": False, "open_task": True, "pending": True, "decided": False,
                          "ended": False, "open_session": True, "run": False}
    remaining = seqs(world.space)
    head = Space.objects.get(pk=world.space.pk).event_seq
    # the newest 5 old events are kept, plus the purge's own event; what remains is gapless
    assert remaining == list(range(remaining[0], head + 1)) and remaining[0] == head - 5
    assert f"oldest kept event seq {remaining[0]}" in text
    assert Event.objects.filter(space=world.space, kind="retention.purged").exists()
    assert seqs(world.other) == list(range(1, len(seqs(world.other)) + 1)), "a space without retention keeps everything"


def test_recent_rows_are_kept_even_when_read_and_closed(world, settings):
    settings.RETENTION_KEEP_EVENTS = 0
    Space.objects.filter(pk=world.space.pk).update(retention_days=1)
    msg = bus.send(world.space, "boss", "w1", "fresh")[0]
    bus.mark_read(supervisor.get_member(world.space, "w1"), [msg.pk])
    counts = retention.purge_space(Space.objects.get(pk=world.space.pk))
    assert counts["messages"] == 0 and counts["events"] == 0 and Message.objects.filter(pk=msg.pk).exists()


def test_the_engine_tick_purges_in_bounded_batches(world, aged, settings):
    summary = tick.tick()
    # TICK_BATCHES x RETENTION_BATCH events a tick at most: 2 x 7 of the ~40 purgeable
    assert summary["purged"] > 0
    first = Event.objects.filter(space=world.space).order_by("seq").first().seq
    assert first == 2 * 7 + 1
    while tick.tick()["purged"]:
        pass
    remaining = seqs(world.space)
    assert remaining == list(range(remaining[0], remaining[-1] + 1))
    assert not kept(aged)["read"] and kept(aged)["unread"]


def test_the_tick_purges_at_most_once_a_period_per_process(world, aged, settings, monkeypatch):
    """The tick runs every few seconds, retention is in days: an idle tick must not scan every space."""
    import time

    settings.RETENTION_EVERY_SECONDS = 60
    monkeypatch.setattr(retention, "_last_purge", time.monotonic())
    assert tick.tick()["purged"] == 0  # within the period: nothing scanned, the old rows wait
    monkeypatch.setattr(retention, "_last_purge", time.monotonic() - 61)
    assert tick.tick()["purged"] > 0
    assert tick.tick()["purged"] == 0  # the period starts again


def test_after_a_vacuum_the_tick_settles_instead_of_eating_the_kept_events(world, aged):
    # the watchdogs would alert on the month-old unread mail once (new events slide the kept window); this is about retention
    Space.objects.update(stuck_run_minutes=0, mailbox_backlog_minutes=0)
    call_command("vacuum", stdout=StringIO())
    kept_before = seqs(world.space)
    # the vacuum's own event moved the newest-5 window by one; the tick takes that one, silently
    assert tick.tick()["purged"] <= 1
    assert tick.tick()["purged"] == 0 and tick.tick()["purged"] == 0
    assert len(seqs(world.space)) >= len(kept_before) - 1


def test_a_client_asking_for_a_purged_range_is_told_then_gets_what_remains(world, aged):
    retention.purge_space(world.space)
    oldest = retention.oldest_seq(world.space.pk)
    viewer = world.client(world.viewer)
    page = viewer.get("/api/spaces/alpha/events/?after=0&limit=3").json()
    assert page["purged_through"] == oldest - 1 and page["events"][0]["seq"] == oldest
    assert "purged_through" not in viewer.get(f"/api/spaces/alpha/events/?after={oldest}").json()


@pytest.fixture
def live_world(transactional_db, tmp_path, settings):
    settings.RETENTION_KEEP_EVENTS = 3
    world = make_world(tmp_path)
    for i in range(10):
        events.emit(world.space.pk, "test.old", n=i)
    age(Event.objects.filter(space=world.space))
    Space.objects.filter(pk=world.space.pk).update(retention_days=30)
    retention.purge_space(Space.objects.get(pk=world.space.pk))
    return world


def test_the_socket_sends_a_purged_frame_then_the_kept_events(live_world):
    oldest = retention.oldest_seq(live_world.space.pk)
    cookie = cookie_for(live_world.viewer)

    async def scenario():
        comm = WebsocketCommunicator(application, "/ws/spaces/alpha/?after=1", headers=[ORIGIN, (b"cookie", cookie)])
        assert (await comm.connect())[0]
        frames, ready = await until_ready(comm)
        assert frames[0]["type"] == "purged" and frames[0]["through"] == oldest - 1
        assert [f["seq"] for f in frames[1:]] == list(range(oldest, ready + 1))
        await comm.disconnect()

    run(scenario)


def test_owners_set_retention_through_api_console_form_and_admin(world, aged):
    owner = world.client(world.owner, csrf=True)
    owner.get("/")
    token = owner.cookies["csrftoken"].value
    preview = owner.get("/api/spaces/alpha/retention/").json()
    assert preview["retention_days"] == 30 and preview["would_purge"]["messages"] == 1
    bad = owner.put("/api/spaces/alpha/retention/", data='{"retention_days": -1}', content_type="application/json",
                    HTTP_X_CSRFTOKEN=token)
    assert bad.status_code == 400 and bad.json()["field"] == "retention_days" and "between 0 and 36500" in bad.json()["error"]
    assert call(world.client(world.operator), "PUT", "/api/spaces/alpha/retention/", {"retention_days": 5}).status_code == 403
    ok = owner.put("/api/spaces/alpha/retention/", data='{"retention_days": 90}', content_type="application/json",
                   HTTP_X_CSRFTOKEN=token)
    assert ok.json()["retention_days"] == 90 and ok.json()["would_purge"]["messages"] == 0  # 40 days < 90

    manage = reverse("console:manage", args=["alpha"])
    page = owner.get(manage)
    assert b'name="retention_days"' in page.content and b'value="90"' in page.content
    owner.post(manage, {"action": "retention", "retention_days": "30", "csrfmiddlewaretoken": token})
    assert Space.objects.get(pk=world.space.pk).retention_days == 30
    assert b"A purge now would remove: 1 messages" in owner.get(manage).content
    refused = owner.post(manage, {"action": "retention", "retention_days": "lots", "csrfmiddlewaretoken": token}, follow=True)
    assert b"retention_days" in refused.content and Space.objects.get(pk=world.space.pk).retention_days == 30

    root = User.objects.create_superuser("root", "r@example.com", "pw")
    admin = Client()
    admin.force_login(root)
    url = reverse("admin:veronica_space_changelist")
    dry = admin.post(url, {"action": "preview_retention", "_selected_action": [world.space.pk]}, follow=True).content.decode()
    assert "1 messages" in dry and Message.objects.filter(pk=aged["read"].pk).exists()
    done = admin.post(url, {"action": "purge_retention", "_selected_action": [world.space.pk]}, follow=True).content.decode()
    assert "alpha: removed 1 messages" in done.lower() and not Message.objects.filter(pk=aged["read"].pk).exists()
    assert Message.objects.filter(pk=aged["unread"].pk).exists()
