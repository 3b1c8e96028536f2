"""Watchdogs (issue 11 item 5): a stuck run and a mailbox backlog alert once per episode, through the
engine tick; task_list tags stale tasks."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from veronica import bus, ledger
from veronica.agent.tools import ToolContext, swarm
from veronica.engine import supervisor, tick, watchdogs
from veronica.models import Event, Member, Message, Task


@pytest.fixture(autouse=True)
def no_wakes(monkeypatch):
    monkeypatch.setattr(tick, "enqueue_wake", lambda *a: None)


def alerts(space, subject: str) -> list[Event]:
    return [e for e in Event.objects.filter(space=space, kind="ops.alert") if e.payload.get("subject") == subject]


def hold_lease(member: Member, minutes_in_phase: int, phase: str = "thinking") -> None:
    Member.objects.filter(pk=member.pk).update(lease_token="tok", lease_expires_at=timezone.now() + timedelta(hours=1),
                                               run_status="busy", phase=phase,
                                               phase_since=timezone.now() - timedelta(minutes=minutes_in_phase))


def test_a_member_stuck_mid_run_alerts_once_per_episode(space):
    w1 = supervisor.get_member(space, "w1")
    hold_lease(w1, minutes_in_phase=10)
    assert tick.tick()["ops"] == 0, "under the 30-minute default threshold"
    hold_lease(w1, minutes_in_phase=45)
    assert tick.tick()["ops"] == 1
    (alert,) = alerts(space, "stuck run")
    assert alert.payload["member_name"] == "w1" and "thinking for 45 minutes" in alert.payload["body"]
    assert Message.objects.filter(recipient_name="operator", subject="Stuck run: w1").count() == 1
    assert watchdogs.stuck_runs() == 0, "one alert per episode"
    Member.objects.filter(pk=w1.pk).update(phase="executing", phase_since=timezone.now())  # it moved: episode over
    watchdogs.stuck_runs()
    assert Member.objects.get(pk=w1.pk).stuck_alerted_at is None
    hold_lease(w1, minutes_in_phase=50, phase="executing")
    assert watchdogs.stuck_runs() == 1 and len(alerts(space, "stuck run")) == 2, "a new episode alerts again"


def test_waiting_on_a_person_or_an_idle_member_is_not_stuck(space):
    w1, w2 = supervisor.get_member(space, "w1"), supervisor.get_member(space, "w2")
    hold_lease(w1, minutes_in_phase=90, phase="waiting-approval")
    Member.objects.filter(pk=w2.pk).update(phase_since=timezone.now() - timedelta(hours=5))  # idle, no lease
    assert watchdogs.stuck_runs() == 0, "waiting-approval and idle members never count"
    space.__class__.objects.filter(pk=space.pk).update(stuck_run_minutes=0)
    hold_lease(supervisor.get_member(space, "boss"), minutes_in_phase=90)
    assert watchdogs.stuck_runs() == 0, "0 turns the watchdog off"


def test_unread_mail_past_the_threshold_alerts_once_per_episode(space):
    bus.send(space, "boss", "w1", "please look")
    Message.objects.filter(recipient__name="w1").update(created_at=timezone.now() - timedelta(minutes=30))
    assert watchdogs.mailbox_backlog() == 0, "under the 60-minute default"
    Message.objects.filter(recipient__name="w1").update(created_at=timezone.now() - timedelta(minutes=90))
    assert tick.tick()["ops"] == 1
    (alert,) = alerts(space, "mailbox backlog")
    assert alert.payload["member_name"] == "w1" and "1 unread messages" in alert.payload["body"]
    assert watchdogs.mailbox_backlog() == 0
    Message.objects.filter(recipient__name="w1").update(read_at=timezone.now())  # drained: episode over
    watchdogs.mailbox_backlog()
    assert Member.objects.get(name="w1", space=space).backlog_alerted_at is None
    bus.send(space, "boss", "w1", "again")
    Message.objects.filter(recipient__name="w1", read_at__isnull=True).update(created_at=timezone.now() - timedelta(hours=2))
    assert watchdogs.mailbox_backlog() == 1 and len(alerts(space, "mailbox backlog")) == 2


def test_task_list_tags_stale_tasks(space):
    w1 = supervisor.get_member(space, "w1")
    old = ledger.create_task(space, "boss", "old job", assignee=w1)
    ledger.create_task(space, "boss", "new job", assignee=w1)
    Task.objects.filter(pk=old.pk).update(started_at=timezone.now() - timedelta(hours=3))  # default threshold 120 min
    out = swarm.task_list(ToolContext(member=supervisor.get_member(space, "boss"), space=space), {})
    lines = {line.split("] ", 1)[-1].split(" →")[0]: line for line in out.splitlines()}
    assert "[running] [stale] old job" in out
    assert "[stale]" not in lines["new job"]
