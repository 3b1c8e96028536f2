"""The notifier's URLs cannot reach the host's own network (loopback, private, link-local, the
metadata service): refused when saved through the API, the console form and the admin, and again
when a notification is sent (the name is resolved and checked at connect time), unless
VERONICA_NOTIFY_ALLOW_HOSTS allows the host."""
from __future__ import annotations

import ipaddress
import json

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from tests.console.helpers import call
from tests.ops_helpers import Receiver
from veronica.ops import alerts, notify, outbound
from veronica.engine import budget, supervisor
from veronica.models import DeliveryStatus, NotificationDelivery, Space

API = "/api/spaces/alpha"
INTERNAL = ["http://127.0.0.1:9/hook", "http://169.254.169.254/latest/meta-data/", "http://10.1.2.3/x", "http://192.168.0.10/",
            "http://[::1]:8080/", "http://[::ffff:127.0.0.1]/", "http://localhost:8000/", "https://api.localhost/", "http://0.0.0.0/",
            "http://100.64.0.1/", "http://[fe80::1]/"]


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(autouse=True)
def inline_delivery(settings, monkeypatch):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.NOTIFY_ALLOW_HOSTS = []
    monkeypatch.setattr(alerts, "enqueue", notify.deliver)


def fake_dns(monkeypatch, answers: dict[str, list[str]]) -> None:
    real = outbound.resolve

    def resolve(host: str, port: int):
        if host in answers:
            return [ipaddress.ip_address(a) for a in answers[host]]
        return real(host, port)

    monkeypatch.setattr(outbound, "resolve", resolve)


def alert(space: Space) -> None:
    Space.objects.filter(pk=space.pk).update(member_daily_tokens=100)
    w1 = supervisor.get_member(space, "w1")
    budget.meter(w1, input_tokens=150, output_tokens=0)
    assert budget.check_breaker(w1)


@pytest.mark.parametrize("url", INTERNAL)
def test_the_api_refuses_an_internal_webhook_url(world, url):
    response = call(world.client(world.owner), "PUT", f"{API}/notify/", {"webhook_url": url})
    assert response.status_code == 400, url
    assert response.json()["field"] == "webhook_url" and "VERONICA_NOTIFY_ALLOW_HOSTS" in response.json()["error"]
    assert Space.objects.get(pk=world.space.pk).notify_webhook_url == "", "nothing half-written"


def test_a_name_that_resolves_to_an_internal_address_is_refused_when_saved(world, monkeypatch):
    fake_dns(monkeypatch, {"hooks.example.test": ["93.184.216.34", "10.0.0.7"]})
    response = call(world.client(world.owner), "PUT", f"{API}/notify/", {"slack_url": "https://hooks.example.test/T1"})
    assert response.status_code == 400 and response.json()["field"] == "slack_url"
    assert "10.0.0.7" in response.json()["error"]


def test_a_public_url_is_accepted(world, monkeypatch):
    fake_dns(monkeypatch, {"hooks.example.test": ["93.184.216.34"]})
    response = call(world.client(world.owner), "PUT", f"{API}/notify/", {"webhook_url": "https://hooks.example.test/h"})
    assert response.status_code == 200 and response.json()["webhook_url"] == "https://hooks.example.test/h"


def test_the_allow_list_admits_a_local_receiver_by_address_or_network(world, settings, receiver, django_capture_on_commit_callbacks):
    for allowed in (["127.0.0.1"], ["127.0.0.0/8"]):
        settings.NOTIFY_ALLOW_HOSTS = allowed
        assert call(world.client(world.owner), "PUT", f"{API}/notify/", {"webhook_url": f"{receiver.url}/hook"}).status_code == 200
    with django_capture_on_commit_callbacks(execute=True):
        alert(world.space)
    assert [path for path, _ in receiver.requests] == ["/hook"]


def test_the_console_form_shows_the_refusal(world):
    client = world.client(world.owner, csrf=True)
    url = reverse("console:manage", args=["alpha"])
    client.get(url)
    response = client.post(url, {"action": "notify", "webhook_url": "http://169.254.169.254/latest/", "slack_url": "", "emails": "",
                                 "csrfmiddlewaretoken": client.cookies["csrftoken"].value})
    assert response.status_code == 400
    assert "webhook_url: webhook_url points at 169.254.169.254" in response.content.decode()
    assert Space.objects.get(pk=world.space.pk).notify_webhook_url == ""


def test_the_admin_refuses_an_internal_url(world):
    client = world.client(User.objects.create_superuser("root", "root@example.com", "pw"))
    change = reverse("admin:veronica_space_change", args=[world.space.pk])
    form = client.get(change).context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None and k not in ("event_seq", "created_at")}
    data.update({"verify_checks": "[]", "notify_webhook_url": "http://[::1]/", "notify_emails": "", "notify_slack_url": "",
                 "members-TOTAL_FORMS": "0", "members-INITIAL_FORMS": "0", "spaceaccess_set-TOTAL_FORMS": "0",
                 "spaceaccess_set-INITIAL_FORMS": "0"})
    data = {k: ("on" if v is True else (json.dumps(v) if isinstance(v, (list, dict)) else v)) for k, v in data.items() if v is not False}
    response = client.post(change, data)
    assert response.status_code == 200
    assert "internal address" in response.context["adminform"].form.errors["notify_webhook_url"][0]


def test_send_time_refuses_a_target_saved_while_it_was_allowed(world, settings, receiver, django_capture_on_commit_callbacks):
    settings.NOTIFY_ALLOW_HOSTS = ["127.0.0.1"]
    notify.configure(world.space, webhook_url=f"{receiver.url}/hook", actor="test")
    settings.NOTIFY_ALLOW_HOSTS = []  # the operator narrows the allow-list afterwards
    with django_capture_on_commit_callbacks(execute=True):
        alert(world.space)
    row = NotificationDelivery.objects.get()
    assert row.status == DeliveryStatus.PENDING and "internal address" in row.last_error
    assert receiver.requests == [], "nothing left the host"


def test_send_time_connects_to_the_checked_address_so_dns_rebinding_cannot_reach_loopback(world, monkeypatch, receiver,
                                                                                          django_capture_on_commit_callbacks):
    answers = {"rebind.example.test": ["93.184.216.34"]}
    fake_dns(monkeypatch, answers)
    port = receiver.url.rsplit(":", 1)[1]
    notify.configure(world.space, webhook_url=f"http://rebind.example.test:{port}/hook", actor="test")
    answers["rebind.example.test"] = ["127.0.0.1"]  # the name now points at the host itself
    with django_capture_on_commit_callbacks(execute=True):
        alert(world.space)
    assert "127.0.0.1" in NotificationDelivery.objects.get().last_error and receiver.requests == []


def test_an_allowed_name_is_reached_at_the_address_the_guard_resolved(world, settings, monkeypatch, receiver,
                                                                      django_capture_on_commit_callbacks):
    settings.NOTIFY_ALLOW_HOSTS = ["receiver.test"]
    fake_dns(monkeypatch, {"receiver.test": ["127.0.0.1"]})  # not in any real DNS: only the guard's answer connects
    port = receiver.url.rsplit(":", 1)[1]
    notify.configure(world.space, webhook_url=f"http://receiver.test:{port}/hook", actor="test")
    with django_capture_on_commit_callbacks(execute=True):
        alert(world.space)
    assert NotificationDelivery.objects.get().status == DeliveryStatus.SENT and [p for p, _ in receiver.requests] == ["/hook"]


def test_a_bad_allow_list_entry_stops_start_up(monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    from veronica.plumbing.env import env_hosts

    monkeypatch.setenv("VERONICA_NOTIFY_ALLOW_HOSTS", "127.0.0.1, hooks.internal, not a host!")
    with pytest.raises(ImproperlyConfigured, match="not a host!"):
        env_hosts("VERONICA_NOTIFY_ALLOW_HOSTS")
