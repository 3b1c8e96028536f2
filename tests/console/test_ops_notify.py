"""The outbound notifier (issue 11 item 2) and the ops surfaces of checks and watchdogs, through the
paths people use: the JSON API, the console manage form (with CSRF), the admin, /metrics. Webhooks
go to a real local HTTP receiver; email uses Django's locmem backend."""
from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.urls import reverse
from django.utils import timezone

from tests.console.helpers import call
from tests.ops_helpers import Receiver
from veronica.swarm import ledger
from veronica.ops import alerts, notify
from veronica.engine import budget, check_queue, checks, supervisor, tick
from veronica.models import DeliveryStatus, Member, NotificationDelivery, Space, Task

API = "/api/spaces/alpha"


@pytest.fixture
def receiver(settings):
    settings.NOTIFY_ALLOW_HOSTS = ["127.0.0.1"]  # the local receiver is on loopback, refused by default
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(autouse=True)
def locmem_and_inline_delivery(settings, monkeypatch):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    monkeypatch.setattr(alerts, "enqueue", notify.deliver)  # the django-q2 task, run in-process
    monkeypatch.setattr(tick, "enqueue_wake", lambda *a: None)


@pytest.fixture
def owner(world):
    return world.client(world.owner)


def configure(owner, receiver, **extra):
    body = {"webhook_url": f"{receiver.url}/hook", "slack_url": f"{receiver.url}/slack", "emails": ["ops@example.com"], **extra}
    return call(owner, "PUT", f"{API}/notify/", body)


def trip_budget(space: Space) -> None:
    Space.objects.filter(pk=space.pk).update(member_daily_tokens=100)
    w1 = supervisor.get_member(space, "w1")
    budget.meter(w1, input_tokens=150, output_tokens=0)
    assert budget.check_breaker(w1)


def test_an_ops_alert_goes_out_through_every_channel_once(world, owner, receiver, django_capture_on_commit_callbacks):
    assert configure(owner, receiver).status_code == 200
    with django_capture_on_commit_callbacks(execute=True):
        trip_budget(world.space)
    paths = {path: body for path, body in receiver.requests}
    assert paths["/hook"]["subject"] == "budget tripped" and paths["/hook"]["member"] == "w1"
    assert paths["/hook"]["space"] == "alpha" and "daily budget is 100" in paths["/hook"]["body"]
    assert paths["/slack"]["text"].startswith("*[alpha] budget tripped*")
    assert len(mail.outbox) == 1 and mail.outbox[0].to == ["ops@example.com"] and "[alpha] budget tripped" in mail.outbox[0].subject
    assert set(NotificationDelivery.objects.values_list("channel", "status")) == {
        ("webhook", "sent"), ("slack", "sent"), ("email", "sent")}
    with django_capture_on_commit_callbacks(execute=True):
        budget.check_breaker(supervisor.get_member(world.space, "w1"))  # still tripped: same episode, no alert
    assert len(receiver.requests) == 2 and NotificationDelivery.objects.count() == 3


def test_a_stale_task_alert_is_notified_once_per_episode(world, owner, receiver, django_capture_on_commit_callbacks):
    configure(owner, receiver, slack_url="", emails=[])
    task = ledger.create_task(world.space, "boss", "long job", assignee=supervisor.get_member(world.space, "w1"))
    Task.objects.filter(pk=task.pk).update(started_at=timezone.now() - timedelta(hours=5))
    with django_capture_on_commit_callbacks(execute=True):
        tick.stale_tasks()
        tick.stale_tasks()
    assert [body["subject"] for _, body in receiver.requests] == ["stale task"]
    assert receiver.requests[0][1]["task"] == task.pk


def test_a_failed_delivery_backs_off_and_the_tick_retries_it(world, owner, receiver, django_capture_on_commit_callbacks):
    configure(owner, receiver, slack_url="", emails=[])
    receiver.statuses = [500]
    with django_capture_on_commit_callbacks(execute=True):
        trip_budget(world.space)
    row = NotificationDelivery.objects.get()
    assert row.status == DeliveryStatus.PENDING and row.attempts == 1 and "HTTP 500" in row.last_error
    assert row.next_at > timezone.now() + timedelta(seconds=20), "backed off"
    assert tick.tick()["ops"] == 0, "not due yet"
    NotificationDelivery.objects.filter(pk=row.pk).update(next_at=timezone.now() - timedelta(seconds=1))
    assert tick.tick()["ops"] == 1
    row.refresh_from_db()
    assert row.status == DeliveryStatus.SENT and row.attempts == 2 and row.last_error == ""
    assert len(receiver.requests) == 2


def test_a_delivery_gives_up_after_the_last_attempt(world, owner, receiver, django_capture_on_commit_callbacks):
    configure(owner, receiver, slack_url="", emails=[])
    receiver.statuses = [503] * notify.MAX_ATTEMPTS
    with django_capture_on_commit_callbacks(execute=True):
        trip_budget(world.space)
    for _ in range(notify.MAX_ATTEMPTS - 1):
        NotificationDelivery.objects.update(next_at=timezone.now() - timedelta(seconds=1))
        notify.retry_due()
    row = NotificationDelivery.objects.get()
    assert row.status == DeliveryStatus.FAILED and row.attempts == notify.MAX_ATTEMPTS and row.next_at is None
    assert notify.retry_due() == 0
    assert [notify.backoff(n).total_seconds() for n in (1, 2, 3)] == [30, 60, 120]


def test_api_configures_validates_and_shows_the_delivery_log_to_owners_only(world, owner, receiver, django_capture_on_commit_callbacks):
    bad = call(owner, "PUT", f"{API}/notify/", {"webhook_url": "ftp://example.com/x"})
    assert bad.status_code == 400 and bad.json() == {"error": "webhook_url must be an http:// or https:// URL", "field": "webhook_url"}
    bad = call(owner, "PUT", f"{API}/notify/", {"emails": ["ops@example.com", "not-an-address"]})
    assert bad.status_code == 400 and bad.json()["field"] == "emails"
    assert Space.objects.get(pk=world.space.pk).notify_webhook_url == "", "nothing half-written"
    assert call(owner, "POST", f"{API}/notify/test/").status_code == 400, "no channel configured"
    configure(owner, receiver)
    with django_capture_on_commit_callbacks(execute=True):
        response = call(owner, "POST", f"{API}/notify/test/")
    assert response.status_code == 202 and {r["channel"] for r in response.json()["queued"]} == {"webhook", "slack", "email"}
    assert dict(receiver.requests)["/hook"]["test"] is True
    log = owner.get(f"{API}/notify/").json()
    assert log["webhook_url"] == f"{receiver.url}/hook" and log["emails"] == ["ops@example.com"]
    assert {d["status"] for d in log["deliveries"]} == {"sent"}
    for user in (world.operator, world.viewer):
        assert world.client(user).get(f"{API}/notify/").status_code == 403
        assert call(world.client(user), "POST", f"{API}/notify/test/").status_code == 403


def _csrf_post(client, url: str, data: dict):
    client.get(url)
    return client.post(url, {**data, "csrfmiddlewaretoken": client.cookies["csrftoken"].value})


def test_console_manage_form_saves_the_notifier_and_the_button_sends_a_test(world, receiver, django_capture_on_commit_callbacks):
    client = world.client(world.owner, csrf=True)
    url = reverse("console:manage", args=["alpha"])
    assert client.post(url, {"action": "notify", "webhook_url": f"{receiver.url}/hook"}).status_code == 403, "CSRF enforced"
    response = _csrf_post(client, url, {"action": "notify", "webhook_url": "javascript:alert(1)", "slack_url": "", "emails": ""})
    assert response.status_code == 400  # the form again, with the field's error
    assert "webhook_url: webhook_url must be an http:// or https:// URL" in response.content.decode()
    response = _csrf_post(client, url, {"action": "notify", "webhook_url": f"{receiver.url}/hook", "slack_url": "",
                                        "emails": "a@example.com, b@example.com"})
    assert response.status_code == 302
    space = Space.objects.get(pk=world.space.pk)
    assert space.notify_webhook_url == f"{receiver.url}/hook" and space.notify_emails == "a@example.com, b@example.com"
    with django_capture_on_commit_callbacks(execute=True):
        assert _csrf_post(client, url, {"action": "notify_test"}).status_code == 302
    assert receiver.requests[0][1]["subject"] == "test notification" and mail.outbox[0].to == ["a@example.com", "b@example.com"]
    page = client.get(url).content.decode()
    assert 'id="deliveries"' in page and "test notification" in page and "Send test notification" in page
    assert world.client(world.operator).get(url).status_code in (403, 404), "the delivery log is for owners"


def test_admin_validates_the_notifier_and_sends_a_test(world, receiver, django_capture_on_commit_callbacks):
    root = User.objects.create_superuser("root", "root@example.com", "pw")
    client = world.client(root)
    change = reverse("admin:veronica_space_change", args=[world.space.pk])
    form = client.get(change).context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None and k not in ("event_seq", "created_at")}
    data.update({"verify_checks": json.dumps([{"name": "t", "command": "true", "timeout": 0}]), "notify_webhook_url": "ftp://x",
                 "notify_emails": "", "notify_slack_url": "",
                 "members-TOTAL_FORMS": "0", "members-INITIAL_FORMS": "0", "spaceaccess_set-TOTAL_FORMS": "0",
                 "spaceaccess_set-INITIAL_FORMS": "0"})
    data = {k: ("on" if v is True else v) for k, v in data.items() if v is not False}
    response = client.post(change, data)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert "http:// or https://" in errors["notify_webhook_url"][0] and "timeout must be an integer" in errors["verify_checks"][0]
    Space.objects.filter(pk=world.space.pk).update(notify_webhook_url=f"{receiver.url}/hook")
    changelist = reverse("admin:veronica_space_changelist")
    with django_capture_on_commit_callbacks(execute=True):
        client.post(changelist, {"action": "send_test_notification", "_selected_action": [world.space.pk]})
    assert [body["subject"] for _, body in receiver.requests] == ["test notification"]
    assert client.get(reverse("admin:veronica_notificationdelivery_changelist")).status_code == 200


def test_checks_counts_on_the_space_page_the_api_and_metrics(world, owner, monkeypatch):
    monkeypatch.setattr(check_queue, "enqueue", lambda task_id: None)
    assert call(owner, "PUT", f"{API}/checks/", {"checks": [{"name": "t", "command": "x"}]}).status_code == 200
    bad = call(owner, "PUT", f"{API}/checks/", {"checks": [{"name": "t"}]})
    assert bad.status_code == 400 and bad.json()["field"] == "verify_checks"
    call(owner, "PUT", f"{API}/checks/", {"checks": [{"name": "fast", "command": "true", "timeout": 5},
                                                      {"name": "slow", "command": "sleep 5", "timeout": 1}]})
    world.space.refresh_from_db()
    task = ledger.create_task(world.space, "boss", "t", assignee=supervisor.get_member(world.space, "w1"), verify_policy="checks")
    ledger.complete(task, actor="w1", result="r")
    checks.run_checks(task.pk)
    assert owner.get(f"{API}/").json()["counts"]["checks"] == {"run": 2, "failed": 1, "timed_out": 1}
    row = owner.get(f"{API}/tasks/").json()["tasks"][0]
    assert row["status"] == "running" and "slow: timed out" in row["check_evidence"]
    page = owner.get(reverse("console:space", args=["alpha"])).content.decode()
    # the board and the usage bars (where the checks' counts are) load after the page, from its panels
    assert 'data-src="/spaces/alpha/panels/usage/"' in page and 'data-src="/spaces/alpha/panels/tasks/"' in page
    panels = "".join(owner.get(f"/spaces/alpha/panels/{name}/").content.decode() for name in ("usage", "tasks"))
    assert "2 run · 1 failed · 1 timed out" in panels and "check evidence" in panels
    metrics = world.client(world.staff).get("/metrics").content.decode()
    assert 'veronica_checks_total{space="alpha",result="timed_out"} 1' in metrics
    assert 'veronica_checks_total{space="alpha",result="run"} 2' in metrics
    assert world.client(world.operator).get(f"{API}/checks/").status_code == 403


def test_watchdog_thresholds_show_in_the_space_settings(world, owner):
    Member.objects.filter(space=world.space, name="w1").update(phase_since=timezone.now())
    settings = owner.get(f"{API}/").json()["settings"]
    assert settings["stuck_run_minutes"] == 30 and settings["mailbox_backlog_minutes"] == 60


def test_owners_set_watchdog_thresholds_from_the_console_and_the_api(world, owner):
    bad = call(owner, "PUT", f"{API}/watchdogs/", {"stuck_run_minutes": 15, "mailbox_backlog_minutes": -1})
    assert bad.status_code == 400 and bad.json()["field"] == "mailbox_backlog_minutes"
    assert Space.objects.get(pk=world.space.pk).stuck_run_minutes == 30, "nothing half-written"
    assert call(owner, "PUT", f"{API}/watchdogs/", {"stuck_run_minutes": 15}).json()["stuck_run_minutes"] == 15
    assert call(world.client(world.operator), "PUT", f"{API}/watchdogs/", {"stuck_run_minutes": 1}).status_code == 403
    client = world.client(world.owner, csrf=True)
    url = reverse("console:manage", args=["alpha"])
    bad = _csrf_post(client, url, {"action": "watchdogs", "stale_task_minutes": "0", "stuck_run_minutes": "20",
                                   "mailbox_backlog_minutes": "five"})
    assert bad.status_code == 400 and "mailbox_backlog_minutes must be a whole number" in bad.content.decode()
    _csrf_post(client, url, {"action": "watchdogs", "stale_task_minutes": "0", "stuck_run_minutes": "20",
                             "mailbox_backlog_minutes": "90"})
    space = Space.objects.get(pk=world.space.pk)
    assert (space.stale_task_minutes, space.stuck_run_minutes, space.mailbox_backlog_minutes) == (0, 20, 90)
