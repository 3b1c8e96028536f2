"""Mail wakes coalesce at the door (issue 13: 1.85 wakes per message, a quarter of claimed runs
without a model call): a member's wake-queued flag makes a second ring enqueue nothing while a wake
is queued or a run holds the slot, and the claim / finish handshake passes it on so no message is
left without a run. Each test below delivers the wakes that were enqueued (a broker that loses
nothing) and checks the mailbox ends empty; the ones named for an interleaving put the mail's
commit exactly there."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext

from veronica.swarm import bus
from veronica.engine import leases, runner, slot, supervisor, tick, wakes
from veronica.models import Member, Message, Run, RunOutcome, Wake


@pytest.fixture
def post(rung, django_capture_on_commit_callbacks):
    """send(): mail committed now (its ring runs at once, as after a real commit); deliver(): run
    every wake enqueued so far, and the ones those runs enqueue, until none is left. (deliver()
    captures no on-commit callbacks: a send nested in it would have its ring run twice.)"""

    class Post:
        queued = rung

        @staticmethod
        def send(space, to: str, body: str):
            with django_capture_on_commit_callbacks(execute=True):
                return bus.send(space, "boss", to, body)

        @staticmethod
        def deliver(limit: int = 50) -> list[str]:
            outcomes = []
            while rung and len(outcomes) < limit:
                member_id, source = rung.pop(0)
                outcomes.append(runner.wake(member_id, source))  # finish() rings directly, after its commit
            assert not rung, "the wakes never stopped coming"
            return outcomes
    return Post


def w1_of(space) -> Member:
    return supervisor.get_member(space, "w1")


def unread(member: Member) -> int:
    return Message.objects.filter(recipient=member, read_at__isnull=True).count()


def flag(member: Member):
    return Member.objects.values_list("wake_queued_at", flat=True).get(pk=member.pk)


def test_a_burst_to_an_idle_member_enqueues_one_wake_and_one_run_reads_it_all(space, scripted, post):
    provider = scripted("all read")
    w1 = w1_of(space)
    for i in range(20):
        post.send(space, "w1", f"job {i}")
    assert post.queued == [(w1.pk, "message")], "the first ring enqueues; the other 19 find the flag up"
    assert post.deliver() == ["done"]
    assert unread(w1) == 0 and len(provider.systems) == 1
    assert Wake.objects.filter(member=w1).count() == 1 and flag(w1) is None


def test_mail_rung_during_a_run_enqueues_nothing_and_finish_passes_it_on(space, scripted, post):
    """The run read its mailbox before this mail came: the ring finds the flag the claim took, and
    finish() (which clears it) rings once for all of it."""
    provider = scripted("first answered", "the rest answered")
    w1 = w1_of(space)
    post.send(space, "w1", "first")
    provider.on_call = lambda n: [post.send(space, "w1", f"during {i}") for i in range(5)] if n == 1 else None
    wake = post.queued.pop(0)
    assert runner.wake(*wake) == "done"
    assert post.queued == [(w1.pk, "message")], "five rings in flight enqueued nothing; finish enqueued one"
    assert post.deliver() == ["done"]
    assert unread(w1) == 0 and len(provider.systems) == 2
    assert Wake.objects.filter(member=w1, claimed=False).count() == 0, "no wake came for nothing"
    assert all(run.model_calls == 1 for run in Run.objects.filter(member=w1)), "every claimed run called the model"


def test_mail_committed_between_the_runs_last_read_and_finish_still_gets_a_run(space, scripted, post, monkeypatch):
    provider = scripted("answered", "the late one answered")
    w1 = w1_of(space)
    real_finish = slot.finish

    def finish_after_late_mail(lease, *args, **kwargs):
        if lease.run.pk == Run.objects.filter(member=w1).order_by("id").values_list("pk", flat=True).first():
            post.send(space, "w1", "late: after the last model call, before finish")
            assert post.queued == [], "the run still holds the flag: the ring enqueues nothing"
        return real_finish(lease, *args, **kwargs)
    monkeypatch.setattr(slot, "finish", finish_after_late_mail)
    post.send(space, "w1", "first")
    assert post.deliver() == ["done", "done"]
    assert unread(w1) == 0 and len(provider.systems) == 2


@pytest.mark.skipif(connection.vendor == "postgresql", reason="PostgreSQL's release looks in its own statement: no gap")
def test_mail_committed_after_the_release_but_before_finish_looks_rings_for_itself(space, scripted, post, monkeypatch):
    """The release's commit cleared the flag: the late mail's own ring enqueues, finish's look finds
    the flag up again and enqueues nothing more."""
    provider = scripted("answered", "the late one answered")
    w1 = w1_of(space)
    real_ring = wakes.ring
    late = []

    def ring(ids, source, *, leftover=False):
        if leftover and not late:
            late.append(post.send(space, "w1", "late: in the gap after the release"))
        return real_ring(ids, source, leftover=leftover)
    monkeypatch.setattr(wakes, "ring", ring)
    post.send(space, "w1", "first")
    assert post.deliver() == ["done", "done"]
    assert unread(w1) == 0 and len(provider.systems) == 2
    assert Wake.objects.filter(member=w1).count() == 2


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the release that looks is PostgreSQL's")
def test_the_release_itself_looks_at_the_mailbox_and_nothing_follows_its_commit(space, scripted, post, monkeypatch):
    """PostgreSQL: a done run's release statement flags the leftover wake for mail that came during the
    run (no statement and no connection of its own after the commit); mail that comes after the commit
    rings for itself, and a run with nothing left flags nothing."""
    provider = scripted("answered", "the late one answered", "and the last")
    w1 = w1_of(space)
    real_finish, statements = slot.finish, []

    def finish(lease, *args, **kwargs):
        if not statements:
            post.send(space, "w1", "late: during the run")
        with CaptureQueriesContext(connection) as queries:
            real_finish(lease, *args, **kwargs)
        statements.append([q["sql"] for q in queries.captured_queries])
    monkeypatch.setattr(slot, "finish", finish)
    post.send(space, "w1", "first")
    assert post.deliver() == ["done", "done"]
    assert unread(w1) == 0 and len(provider.systems) == 2 and flag(w1) is None
    for sqls in statements:
        assert sqls[-1].startswith("RELEASE SAVEPOINT") or "veronica_event" in sqls[-1], sqls[-1][:120]
        assert not [s for s in sqls if s.startswith('UPDATE "veronica_member" SET "wake_queued_at"')], "no look after the commit"
    post.send(space, "w1", "after the commit")
    assert post.deliver() == ["done"] and unread(w1) == 0


def test_a_wake_that_claims_nothing_gives_the_flag_back_and_looks_again(space, scripted, post, monkeypatch):
    """The wake's claim found no mail; a message commits before the wake clears the flag (its ring
    finds the flag up). Clearing the flag without a second look would lose that message."""
    provider = scripted("first", "the second one")
    w1 = w1_of(space)
    post.send(space, "w1", "first")
    post.deliver()
    post.send(space, "w1", "drained by somebody else")  # flag up, a wake queued...
    Message.objects.filter(recipient=w1).update(read_at=Now())  # ...whose mail is read before it arrives
    real_claim, looks = slot.claim, []

    def claim(member_id, source, **kwargs):
        lease = real_claim(member_id, source, **kwargs)
        looks.append(lease)
        if len(looks) == 1:
            assert lease is None
            post.send(space, "w1", "committed between the failed claim and the flag's clear")
        return lease
    monkeypatch.setattr(slot, "claim", claim)
    assert post.queued == [(w1.pk, "message")]
    assert post.deliver() == ["done"], "the second look claims the new mail"
    assert len(looks) == 2 and unread(w1) == 0 and len(provider.systems) == 2


def test_a_wake_for_nothing_clears_the_flag_so_the_next_mail_rings(space, scripted, post):
    scripted("ok", "ok")
    w1 = w1_of(space)
    post.send(space, "w1", "one")
    Message.objects.filter(recipient=w1).update(read_at=Now())
    assert post.deliver() == ["nothing-to-do"]
    assert flag(w1) is None
    post.send(space, "w1", "two")
    assert post.deliver() == ["done"] and unread(w1) == 0


def test_a_wake_that_finds_the_slot_held_leaves_the_flag_to_the_run(space, post):
    """A wake queued before another wake's run took the slot: it coalesces, and the flag stays with
    the run (whose finish clears it), so mail during that run still rings nothing."""
    w1 = w1_of(space)
    post.send(space, "w1", "one")
    lease = slot.claim(w1.pk, "resume")  # some other wake's run has the slot
    assert runner.wake(*post.queued.pop(0)) == "coalesced"
    assert flag(w1) is not None
    post.send(space, "w1", "during the run")
    assert post.queued == []
    slot.finish(lease, RunOutcome.DONE)
    assert flag(w1) is not None and post.queued == [(w1.pk, "message")], "finish cleared it and rang for the mail left"


def test_a_lost_wake_suppresses_rings_for_at_most_stale_seconds_and_the_sweep_recovers_its_mail(space, scripted, post):
    """The flag's wake was lost (a broker restart, a worker killed between fetching it and the
    claim): no run holds the slot, so after STALE_SECONDS the flag no longer counts, and the mail
    that rang meanwhile is re-woken by the tick's unread sweep."""
    assert wakes.STALE_SECONDS <= tick.SWEEP_AFTER.total_seconds(), "the two bounds on a lost wake agree"
    scripted("recovered")
    w1 = w1_of(space)
    post.send(space, "w1", "its wake is lost")
    post.queued.clear()
    post.send(space, "w1", "rang while the lost flag was fresh")
    assert post.queued == [], "within STALE_SECONDS the flag still counts"
    long_ago = Now() - timedelta(seconds=tick.SWEEP_AFTER.total_seconds() + 1)
    Member.objects.filter(pk=w1.pk).update(wake_queued_at=long_ago)
    Message.objects.filter(recipient=w1).update(created_at=long_ago)
    assert tick.sweep_unread() == [w1.pk], "the sweep re-wakes mail nobody came for"
    assert post.deliver() == ["done"] and unread(w1) == 0
    post.send(space, "w1", "and the door works again")
    assert post.queued == [(w1.pk, "message")]


def test_a_stale_flag_lets_the_next_ring_through(space, post):
    w1 = w1_of(space)
    post.send(space, "w1", "its wake is lost")
    post.queued.clear()
    Member.objects.filter(pk=w1.pk).update(wake_queued_at=Now() - timedelta(seconds=wakes.STALE_SECONDS + 1))
    post.send(space, "w1", "next")
    assert post.queued == [(w1.pk, "message")]


def test_a_worker_that_dies_holding_the_flag_in_a_run_is_released_by_the_lease_watchdog(space, scripted, post,
                                                                                       django_capture_on_commit_callbacks):
    """A run's flag never goes stale while it holds the lease; the watchdog's release clears it."""
    scripted("recovered")
    w1 = w1_of(space)
    post.send(space, "w1", "the job")
    slot.claim(post.queued.pop(0)[0], "message")  # the run starts... and its worker is SIGKILLed
    Member.objects.filter(pk=w1.pk).update(wake_queued_at=Now() - timedelta(hours=1), lease_expires_at=Now() - timedelta(seconds=1))
    post.send(space, "w1", "while the dead run holds the slot")
    assert post.queued == [], "a flag held by a run (even an old one) is the run's"
    with django_capture_on_commit_callbacks(execute=True):
        assert leases.expire_leases() == [w1.pk]
    assert flag(w1) is None
    assert post.queued == [(w1.pk, "resume")]
    assert post.deliver() == ["done"] and unread(w1) == 0


def test_a_refused_enqueue_gives_the_flag_back(space, monkeypatch, django_capture_on_commit_callbacks):
    w1 = w1_of(space)
    monkeypatch.setattr(wakes, "enqueue_wake", lambda pk, source: False)  # the broker is down
    with django_capture_on_commit_callbacks(execute=True):
        bus.send(space, "boss", "w1", "nobody queued this")
    assert flag(w1) is None, "a flag with no wake behind it would silence the door until it went stale"


def test_one_ring_is_one_statement_for_every_recipient(space, rung, django_assert_num_queries):
    ids = list(Member.objects.filter(space=space).values_list("pk", flat=True))
    with django_assert_num_queries(1):
        assert wakes.ring(ids, "message") == sorted(ids)
    with django_assert_num_queries(1):
        assert wakes.ring(ids, "message") == []
    assert sorted(pk for pk, _ in rung) == sorted(ids)


def test_resume_and_timer_wakes_are_never_suppressed(space, rung, post):
    w1 = w1_of(space)
    post.send(space, "w1", "mail")
    assert wakes.ring([w1.pk], "resume") == [w1.pk] and wakes.ring([w1.pk], "timer") == [w1.pk]
    assert [s for _, s in rung] == ["message", "resume", "timer"]


def test_a_run_no_mail_ring_started_owns_the_flag_too(space, scripted, post):
    """A timer's (or a resume's) run took the slot with no flag up: its claim raises it, so mail
    during that run enqueues no wake that would only find the slot held."""
    provider = scripted("the schedule's work", "the mail answered")
    w1 = w1_of(space)
    during = []

    def mail_during_run(n):
        if n == 1:
            post.send(space, "w1", "during the timer's run")
            during.extend(post.queued)
    provider.on_call = mail_during_run
    assert runner.wake(w1.pk, "timer") == "done"
    assert during == [], "the ring found the run's flag"
    assert post.queued == [(w1.pk, "message")] and post.deliver() == ["done"] and unread(w1) == 0


# --- the rings of one commit ring together ----------------------------------------------------------
def flag_updates(queries) -> int:
    return sum(1 for q in queries if q["sql"].startswith("UPDATE") and "wake_queued_at" in q["sql"])


def test_the_rings_of_one_commit_set_every_flag_in_one_statement(db, tmp_path, rung, django_capture_on_commit_callbacks):
    """Mail to many members in one commit (a bench's 500, a manifest's briefs): one flag UPDATE after
    the commit rings them all, not one UPDATE (and its round trip) per message, one after another."""
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from tests.conftest import make_space

    space = make_space(tmp_path, workers=tuple(f"w{i}" for i in range(12)))
    with django_capture_on_commit_callbacks() as hooks:
        with transaction.atomic():
            for i in range(12):
                bus.send(space, "boss", f"w{i}", "go")
    rings = [hook for hook in hooks if hook.__qualname__.startswith("_pending_ring")]
    assert len(rings) == 1, "one ring per source, however many messages"
    with CaptureQueriesContext(connection) as queries:
        rings[0]()
    assert flag_updates(queries.captured_queries) == 1
    woken = sorted(Member.objects.filter(space=space, name__startswith="w").values_list("pk", flat=True))
    assert sorted(pk for pk, _ in rung) == woken and {source for _, source in rung} == {"message"}


def test_mail_in_a_savepoint_rolled_back_rings_nobody(space, rung, django_capture_on_commit_callbacks):
    from django.db import transaction

    with django_capture_on_commit_callbacks(execute=True):
        with transaction.atomic():
            bus.send(space, "boss", "w1", "kept")
            try:
                with transaction.atomic():
                    bus.send(space, "boss", "w2", "rolled back")
                    raise RuntimeError
            except RuntimeError:
                pass
            bus.send(space, "boss", "w1", "kept too")
    assert rung == [(w1_of(space).pk, "message")], "w2's mail was rolled back: its ring with it"
    assert not Message.objects.filter(body="rolled back").exists()


def test_a_later_transaction_rings_again_after_one_rolled_back(space, rung, django_capture_on_commit_callbacks):
    """The hook of a rolled-back transaction is gone: the next transaction's mail registers its own."""
    from django.db import transaction

    with django_capture_on_commit_callbacks(execute=True):
        try:
            with transaction.atomic():
                bus.send(space, "boss", "w1", "lost")
                raise RuntimeError
        except RuntimeError:
            pass
        with transaction.atomic():
            bus.send(space, "boss", "w2", "sent")
    assert rung == [(supervisor.get_member(space, "w2").pk, "message")]
