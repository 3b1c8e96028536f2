"""/metrics: Prometheus text from the rows, for staff (session or a staff token) only."""
from datetime import timedelta

from django.test import Client
from django.utils import timezone

from veronica import access, bus, ledger
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
