"""The engine keeps time by the database: a host whose clock runs ahead or behind (only what
Python reads is shifted) sweeps lost mail, fires watchdogs and wakes for a lease's end exactly when
a host with the right time would."""
from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import close_old_connections
from django.utils import timezone

from tests.conftest import make_space
from tests.harness import REPO, isolate_queue, qcluster, wait_for
from veronica.engine import clock, leases, supervisor, tick
from veronica.engine.ticker import Ticker
from veronica.models import Member, Message, Wake

SKEWS = [pytest.param(-120, id="behind"), pytest.param(120, id="ahead")]


@pytest.fixture
def skew(monkeypatch):
    def shift(seconds: float) -> None:
        real = timezone.now
        monkeypatch.setattr(timezone, "now", lambda: real() + timedelta(seconds=seconds))
    return shift


def lost_mail(space, to: str, age_seconds: float) -> Message:
    """Mail stamped `age_seconds` ago on the database's clock whose wake was lost."""
    member = supervisor.get_member(space, to)
    message = Message.objects.create(space=space, sender_name="operator", recipient=member, recipient_name=to, body="hi")
    Message.objects.filter(pk=message.pk).update(created_at=clock.db_now() - timedelta(seconds=age_seconds))
    Wake.objects.filter(member=member).delete()
    return message


@pytest.mark.django_db
@pytest.mark.parametrize("seconds", SKEWS)
def test_the_sweep_compares_mail_with_the_databases_clock(space, skew, seconds):
    old = lost_mail(space, "w1", tick.SWEEP_AFTER.total_seconds() + 5)
    fresh = lost_mail(space, "w2", 1)
    skew(seconds)
    with clock.ticking():
        swept = tick.sweep_unread()
    assert old.recipient_id in swept, "mail past the sweep's wait is swept, whatever this host's clock says"
    assert fresh.recipient_id not in swept, "fresh mail is left to its own wake, whatever this host's clock says"


@pytest.mark.django_db
@pytest.mark.parametrize("seconds", SKEWS)
def test_the_leading_ticker_waits_for_the_lease_end_on_the_databases_clock(space, skew, seconds):
    skew(seconds)
    ticker = Ticker(period=5, holder="a")
    w1 = supervisor.get_member(space, "w1")
    Member.objects.filter(pk=w1.pk).update(run_status="busy", lease_token="t", lease_expires_at=leases.db_now_plus(3))
    ticker.beat()
    assert 2.0 <= ticker.pause(0) <= 3.1, "neither spin (clock ahead) nor a whole period (clock behind)"


@pytest.mark.django_db
@pytest.mark.parametrize("seconds", SKEWS)
def test_the_mailbox_watchdog_reads_the_databases_clock(tmp_path, skew, seconds):
    space = make_space(tmp_path, mailbox_backlog_minutes=5)
    young = lost_mail(space, "w1", 4 * 60)  # under the 5-minute threshold on the database's clock
    old = lost_mail(space, "w2", 6 * 60)  # over it
    skew(seconds * 2)  # 4 minutes off: ahead would alert on the young mail, behind miss the old
    from veronica.engine import watchdogs

    with clock.ticking():
        assert watchdogs.mailbox_backlog() == 1
    assert Member.objects.get(pk=old.recipient_id).backlog_alerted_at is not None
    assert Member.objects.get(pk=young.recipient_id).backlog_alerted_at is None


def test_db_now_is_the_databases_clock_not_this_processes(db, skew):
    skew(3600)
    assert abs((clock.db_now() - timezone.now()).total_seconds() + 3600) < 60


@pytest.mark.cluster
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("seconds", [pytest.param(0, id="control"), *SKEWS])
def test_a_skewed_cluster_sweeps_lost_mail_and_expires_a_dead_lease_on_time(tmp_path, seconds):
    isolate_queue()
    space = make_space(tmp_path, workers=("w1", "w2"))
    env = dict(VERONICA_ENGINE_TICK_SECONDS="1", VERONICA_Q_STOP_GRACE="3",
               PYTHONPATH=str(REPO / "tests" / "skewed_clock"), VERONICA_TEST_CLOCK_SKEW=str(seconds))
    w2 = supervisor.get_member(space, "w2")
    with qcluster(workers=2, log_path=tmp_path / "cluster.log", **env):
        # a dead worker's lease, running out 4 s from now on the database's clock
        Member.objects.filter(pk=w2.pk).update(run_status="busy", lease_token="dead", lease_expires_at=leases.db_now_plus(4))
        message = lost_mail(space, "w1", tick.SWEEP_AFTER.total_seconds() - 6)  # due for the sweep in 6 s
        started = time.monotonic()
        wait_for(lambda: close_old_connections() or not Member.objects.filter(pk=w2.pk, lease_token="dead").exists(), timeout=30)
        expired_after = time.monotonic() - started
        wait_for(lambda: Message.objects.filter(pk=message.pk, read_at__isnull=False).exists(), timeout=60)
        swept_after = time.monotonic() - started
    assert expired_after < 4 + 3, f"the dead lease was expired {expired_after:.1f}s after being set to run out in 4 s"
    assert swept_after < 6 + 8, f"the lost mail was swept {swept_after:.1f}s after it came due (in 6 s)"
