"""Watchdogs (issue 11 item 5): a stuck run and a mailbox backlog alert once per episode, through the
engine tick; task_list tags stale tasks."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from veronica.swarm import bus, ledger
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


def test_fresh_unread_mail_costs_the_backlog_watchdog_no_member_query(space):
    """Every tick runs it: with no mail older than the threshold it reads the alerted members (none) and
    the old unread mail's recipients (none), and never joins every member to the unread mail (a planner
    without statistics walked the unread mail once per member there: 7-25 ms a tick at 500 members)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for name in ("w1", "w2", "boss"):
        bus.send(space, "boss" if name != "boss" else "w1", name, "fresh")
    with CaptureQueriesContext(connection) as captured:
        assert watchdogs.mailbox_backlog() == 0
    on_members = [q["sql"] for q in captured.captured_queries if 'FROM "veronica_member"' in q["sql"]]
    assert len(on_members) == 1 and "backlog_alerted_at" in on_members[0], on_members
    statements = [q["sql"] for q in captured.captured_queries if "veronica_" in q["sql"]]  # not the clock's read
    assert len(statements) == 2, statements


def test_a_members_oldest_unread_mail_is_one_index_entry(space):
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("index plans are PostgreSQL's")
    bus.send(space, "boss", "w1", "one")
    bus.send(space, "boss", "w1", "two")
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a few rows: the plan a big table gets
    plan = Member.objects.order_by().annotate(oldest=watchdogs._oldest_unread()).explain()
    assert "msg_unread_recipient_idx" in plan and "Sort" not in plan, plan


def test_task_list_tags_stale_tasks(space):
    w1 = supervisor.get_member(space, "w1")
    old = ledger.create_task(space, "boss", "old job", assignee=w1)
    ledger.create_task(space, "boss", "new job", assignee=w1)
    Task.objects.filter(pk=old.pk).update(started_at=timezone.now() - timedelta(hours=3))  # default threshold 120 min
    out = swarm.task_list(ToolContext(member=supervisor.get_member(space, "boss"), space=space), {})
    lines = {line.split("] ", 1)[-1].split(" →")[0]: line for line in out.splitlines()}
    assert "[running] [stale] old job" in out
    assert "[stale]" not in lines["new job"]


def test_a_new_call_in_an_unchanged_phase_is_progress_not_a_stall(space):
    """Two calls of one tool in a row keep the phase executing:grep; the second call still re-stamps
    phase_since (the stall clock), without a second member.phase event."""
    from veronica.engine import slot

    w1 = supervisor.get_member(space, "w1")
    lease = slot.claim(w1, "message")
    lease.phase("executing", "grep", step=True)
    phases = Event.objects.filter(space=space, kind="member.phase").count()
    Member.objects.filter(pk=w1.pk).update(phase_since=timezone.now() - timedelta(minutes=45))
    lease.phase("executing", "grep")  # a report, not a new call: the clock stays
    assert Member.objects.get(pk=w1.pk).phase_since < timezone.now() - timedelta(minutes=44)
    lease.phase("executing", "grep", step=True)  # the next grep call starts
    assert Member.objects.get(pk=w1.pk).phase_since > timezone.now() - timedelta(minutes=1)
    assert Event.objects.filter(space=space, kind="member.phase").count() == phases, "no event for an unchanged phase"
    assert watchdogs.stuck_runs() == 0
    Member.objects.filter(pk=w1.pk).update(phase_since=timezone.now() - timedelta(minutes=45))
    assert watchdogs.stuck_runs() == 1, "no call for 45 minutes while holding the lease: a stall"
    slot.finish(lease, "done")


def test_a_run_past_its_lease_is_for_the_lease_recovery_not_a_stall_alert(space):
    w1 = supervisor.get_member(space, "w1")
    hold_lease(w1, minutes_in_phase=45)
    Member.objects.filter(pk=w1.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=5))  # its holder died
    assert watchdogs.stuck_runs() == 0 and alerts(space, "stuck run") == []
    Member.objects.filter(pk=w1.pk).update(lease_expires_at=timezone.now() + timedelta(minutes=1))  # a live heartbeat
    assert watchdogs.stuck_runs() == 1


def test_two_calls_of_one_tool_in_a_reply_each_restart_the_stall_clock(space, scripted, monkeypatch, tmp_path):
    """Through the real agent loop: the second glob of one reply finds phase_since fresh even though
    the phase (executing:glob) never changed. (Two read_file calls run inside the model turn's own
    transaction: nothing of the step commits between them, so there is no clock to restart.)"""
    from veronica.swarm import events
    from veronica.agent.providers.base import Reply, ToolCall, Usage
    from veronica.engine import runner

    for name in ("a.txt", "b.txt"):
        (tmp_path / "alpha" / name).write_text(name)
    scripted(Reply(tool_calls=[ToolCall(id="c1", name="glob", args={"pattern": "a.*"}),
                               ToolCall(id="c2", name="glob", args={"pattern": "b.*"})], usage=Usage(input=100, output=10)),
             "both read")
    clock_at_call, real_emit = [], events.emit

    def emit(space_id, kind, **payload):
        if kind == "tool.called":  # right after the call's phase report, inside its fence
            member = payload["member"]
            clock_at_call.append(Member.objects.get(pk=member.pk).phase_since)
            Member.objects.filter(pk=member.pk).update(phase_since=timezone.now() - timedelta(minutes=45))  # the call ran long
        return real_emit(space_id, kind, **payload)

    monkeypatch.setattr(events, "emit", emit)
    bus.send(space, "boss", "w1", "read both")
    assert runner.wake(supervisor.get_member(space, "w1").pk, "message") == "done"
    assert len(clock_at_call) == 2
    assert clock_at_call[1] > timezone.now() - timedelta(minutes=1), "the second call re-stamped the stall clock"


def test_watchdog_alerts_reach_the_leader_once_per_episode_but_never_about_itself(space):
    hold_lease(supervisor.get_member(space, "w1"), minutes_in_phase=45)
    bus.send(space, "boss", "w2", "please look")
    Message.objects.filter(recipient__name="w2").update(created_at=timezone.now() - timedelta(minutes=90))
    for _ in range(3):  # a storm of ticks: one mail per alert, deduped like the alert
        tick.tick()
    to_boss = sorted(Message.objects.filter(recipient_name="boss", sender_name=bus.SYSTEM).values_list("subject", flat=True))
    assert to_boss == ["Mailbox backlog: w2", "Stuck run: w1"]
    assert Message.objects.filter(recipient_name="operator", subject="Stuck run: w1").count() == 1

    hold_lease(supervisor.get_member(space, "boss"), minutes_in_phase=45)
    Message.objects.filter(recipient__name="boss").update(created_at=timezone.now() - timedelta(minutes=90))
    tick.tick()
    assert {a.payload["member_name"] for a in alerts(space, "stuck run")} == {"w1", "boss"}
    assert {a.payload["member_name"] for a in alerts(space, "mailbox backlog")} == {"w2", "boss"}
    assert Message.objects.filter(recipient_name="operator", subject__endswith=": boss").count() == 2
    assert not Message.objects.filter(recipient_name="boss", subject__endswith=": boss").exists(), "no mail to itself about itself"
