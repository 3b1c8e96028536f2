"""The wake's claim carries its gates: a mail wake whose mail a run already drained claims nothing.

Issue 13: a quarter of claimed runs made no model call (their mail had come during the run before
and was drained by it), and every wake read the member and its breaker before claiming. The claim's
one UPDATE now checks active, idle, runnable, breaker and unread mail together; no wake is lost:
a run with work left in its transcript still claims without mail, and the sweep stays the backstop.
"""
from __future__ import annotations

from veronica.swarm import bus, events
from veronica.agent import transcript
from veronica.engine import runner, supervisor
from veronica.models import Event, Member, Run, TurnRole, Wake


def w1_of(space):
    return supervisor.get_member(space, "w1")


def test_a_mail_wake_whose_mail_was_drained_claims_nothing(space, scripted, django_assert_max_num_queries):
    provider = scripted("ok")
    bus.send(space, "boss", "w1", "hi")
    assert runner.wake(w1_of(space).pk, "message") == "done"  # the run drains the mail
    seq, w1 = Event.objects.filter(space=space).count(), w1_of(space)
    with django_assert_max_num_queries(6):  # claim UPDATE (+ its transaction), why not, transcript look, the Wake row
        assert runner.wake(w1.pk, "message") == "nothing-to-do"  # the wake its mail rang, arriving late
    assert Run.objects.count() == 1 and len(provider.systems) == 1
    assert Event.objects.filter(space=space).count() == seq, "no run.started / run.ended for nothing"
    assert list(Wake.objects.filter(member=w1_of(space)).values_list("claimed", flat=True)) == [True, False]


def test_new_mail_after_a_drained_wake_still_runs(space, scripted):
    provider = scripted("first", "second")
    bus.send(space, "boss", "w1", "one")
    runner.wake(w1_of(space).pk, "message")
    assert runner.wake(w1_of(space).pk, "message") == "nothing-to-do"
    bus.send(space, "boss", "w1", "two")
    assert runner.wake(w1_of(space).pk, "message") == "done"
    assert len(provider.systems) == 2


def test_a_mail_wake_without_mail_still_runs_an_unanswered_brief(space, scripted):
    """A stopped run left its brief unanswered and no mail is unread: the wake must not drop it."""
    provider = scripted("answered")
    w1 = w1_of(space)
    transcript.append(transcript.open_session(w1), TurnRole.USER, "a brief nobody answered yet")
    assert runner.wake(w1.pk, "message") == "done"
    assert len(provider.systems) == 1


def test_the_claim_reads_nothing_before_the_run_starts(space, scripted, django_assert_max_num_queries):
    """The run's start is the claim's own transaction: the member is read inside it, after the UPDATE."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    scripted("ok")
    bus.send(space, "boss", "w1", "hi")
    w1 = w1_of(space)
    with CaptureQueriesContext(connection) as queries:
        runner.wake(w1.pk, "message")
    sqls = [q["sql"] for q in queries.captured_queries]
    first_run_insert = next(i for i, sql in enumerate(sqls) if 'INSERT INTO "veronica_run"' in sql)
    before = [sql for sql in sqls[:first_run_insert + 1] if not sql.startswith(("BEGIN", "SAVEPOINT", "RELEASE"))]
    # the claim UPDATE and the Run INSERT (then the member it claimed); on PostgreSQL one statement, all three
    assert len(before) <= 2, before
    assert before[0].startswith(('UPDATE "veronica_member"', 'WITH c AS (UPDATE "veronica_member"'))


def test_a_busy_members_mail_wake_is_still_coalesced(space, scripted):
    w1 = w1_of(space)
    Member.objects.filter(pk=w1.pk).update(run_status="busy", lease_token="held")
    events.emit(space.pk, "test.noise")
    assert runner.wake(w1.pk, "message") == "coalesced"  # no mail, but a run is in flight: that is the reason


def test_the_compiled_claim_follows_the_lease_length_and_its_gates(space, settings):
    """The claim's UPDATE is compiled once per shape: a new lease length or another gate set is
    another shape, never the cached statement of the last one."""
    from datetime import timedelta

    from django.utils import timezone

    from veronica.engine import slot
    from veronica.models import UsageDay

    w1 = w1_of(space)
    for seconds in (60, 600):
        settings.RUN_LEASE_SECONDS = seconds
        lease = slot.claim(w1.pk, "message")
        expires = Member.objects.get(pk=w1.pk).lease_expires_at
        assert timedelta(seconds=seconds - 30) < expires - timezone.now() <= timedelta(seconds=seconds)
        slot.finish(lease, "done")
    assert slot.claim(w1.pk, "message", gates=("mail",)) is None  # no mail: the mail gate holds
    UsageDay.objects.create(member=w1, space=space, day=timezone.now().date(), tripped=True)
    assert slot.claim(w1.pk, "message", gates=("breaker",)) is None  # tripped: the breaker gate holds
    lease = slot.claim(w1.pk, "message")  # no gates: claimed
    assert lease is not None and lease.member.space == space
    slot.finish(lease, "done")
