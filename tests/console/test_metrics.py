"""/metrics: Prometheus text from the rows, for staff (session or a staff token) only."""
from datetime import timedelta

from django.test import Client
from django.utils import timezone

from veronica.swarm import access, bus, ledger
from veronica.engine import budget, supervisor
from veronica.models import Run, Wake


def test_metrics_are_for_staff_only(world):
    assert Client().get("/metrics").status_code == 401
    assert world.client(world.owner).get("/metrics").status_code == 403
    _, key = access.create_token(world.operator, "t")
    assert Client(HTTP_AUTHORIZATION=f"Bearer {key}").get("/metrics").status_code == 403
    _, staff_key = access.create_token(world.staff, "prom")
    assert Client(HTTP_AUTHORIZATION=f"Bearer {staff_key}").get("/metrics").status_code == 200


def test_metrics_count_wakes_runs_tokens_and_engine_rows(world):
    w1 = supervisor.get_member(world.space, "w1")
    now = timezone.now()
    Wake.objects.create(member=w1, source="message", claimed=True)
    Wake.objects.create(member=w1, source="message", claimed=False)
    Wake.objects.create(member=w1, source="timer", claimed=True)
    Run.objects.create(member=w1, source="message", lease_token="a", started_at=now - timedelta(seconds=3), ended_at=now,
                       outcome="done", tokens=800)
    Run.objects.create(member=w1, source="timer", lease_token="b", started_at=now - timedelta(seconds=100), ended_at=now,
                       outcome="aborted", tokens=20000)
    Run.objects.create(member=w1, source="timer", lease_token="c", started_at=now, outcome="running")
    budget.meter(w1, input_tokens=100, output_tokens=50)
    bus.send(world.space, "boss", "w1", "hello")
    ledger.create_task(world.space, "boss", "t")
    body = world.client(world.staff).get("/metrics")
    assert body["Content-Type"].startswith("text/plain; version=0.0.4")
    text = body.content.decode()
    assert 'veronica_wakes_total{space="alpha",source="message",claimed="true"} 1' in text
    assert 'veronica_wakes_total{space="alpha",source="message",claimed="false"} 1' in text
    assert 'veronica_runs_total{space="alpha",outcome="done"} 1' in text
    assert 'veronica_run_aborts_total{space="alpha",outcome="aborted"} 1' in text
    assert 'veronica_run_duration_seconds_bucket{space="alpha",le="5"} 1' in text
    assert 'veronica_run_duration_seconds_bucket{space="alpha",le="120"} 2' in text
    assert 'veronica_run_duration_seconds_count{space="alpha"} 2' in text
    assert 'veronica_run_duration_seconds_sum{space="alpha"} 103' in text
    assert 'veronica_run_tokens_bucket{space="alpha",le="1000"} 1' in text
    assert 'veronica_run_tokens_sum{space="alpha"} 20800' in text
    assert 'veronica_tokens_total{space="alpha",class="input"} 100' in text
    assert 'veronica_messages_total{space="alpha"} 1' in text
    assert 'veronica_tasks{space="alpha",status="ready"} 1' in text
    assert 'veronica_events_total{space="alpha"}' in text and 'space="beta"' in text
    for line in text.splitlines():
        assert line.startswith("#") or line.startswith("veronica_"), line


def test_metrics_have_uptime_alert_counts_and_run_histograms_per_member(world, monkeypatch):
    import re
    import time

    from veronica.engine import tick, watchdogs
    from veronica.models import Message, Task

    monkeypatch.setattr(tick, "enqueue_wake", lambda *a: None)
    w1, w2 = supervisor.get_member(world.space, "w1"), supervisor.get_member(world.space, "w2")
    now = timezone.now()
    for member, seconds, tokens in ((w1, 3, 800), (w1, 100, 20000), (w2, 700, 60000)):
        Run.objects.create(member=member, source="message", lease_token="t", started_at=now - timedelta(seconds=seconds), ended_at=now,
                           outcome="done", tokens=tokens)
    task = ledger.create_task(world.space, "boss", "slow job", assignee=w1)
    Task.objects.filter(pk=task.pk).update(started_at=now - timedelta(hours=5))
    bus.send(world.space, "boss", "w2", "please look")
    Message.objects.filter(recipient=w2).update(created_at=now - timedelta(hours=5))
    tick.tick()
    tick.tick()  # one alert per episode: the counts do not grow with the ticks
    Message.objects.filter(recipient=w2).update(read_at=now)
    watchdogs.mailbox_backlog()  # the episode ends; the marker is cleared, the count stays
    text = world.client(world.staff).get("/metrics").content.decode()

    assert 'veronica_ops_alerts_total{space="alpha",alert="stale_task"} 1' in text
    assert 'veronica_ops_alerts_total{space="alpha",alert="mailbox_backlog"} 1' in text
    started = float(re.search(r"^veronica_process_start_time_seconds (\S+)$", text, re.M).group(1))
    uptime = float(re.search(r"^veronica_uptime_seconds (\S+)$", text, re.M).group(1))
    assert started < time.time() and abs(started + uptime - time.time()) < 5
    assert 'veronica_member_run_duration_seconds_bucket{space="alpha",member="w1",le="10"} 1' in text
    assert 'veronica_member_run_duration_seconds_bucket{space="alpha",member="w1",le="600"} 2' in text
    assert 'veronica_member_run_duration_seconds_count{space="alpha",member="w2"} 1' in text
    assert 'veronica_member_run_duration_seconds_bucket{space="alpha",member="w2",le="600"} 0' in text
    assert 'veronica_member_run_tokens_bucket{space="alpha",member="w1",le="1000"} 1' in text
    assert 'veronica_member_run_tokens_sum{space="alpha",member="w2"} 60000' in text
    assert 'veronica_member_run_tokens_bucket{space="alpha",member="w2",le="+Inf"} 1' in text
    buckets = [line for line in text.splitlines() if line.startswith("veronica_member_run_tokens_bucket")]
    assert len(buckets) == 2 * 4, "coarse buckets: 3 bounds and +Inf per member with runs"
