"""Inbound webhook: signed deliveries mail and wake a member; bad signature, stale, replayed,
oversize, unknown target are clear 4xx; owners make and rotate the secret, which is shown once."""
import json
import time

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from tests.console.helpers import call
from veronica.ops import webhooks
from veronica.engine import retention
from veronica.models import Event, Member, Message, Space, WebhookDelivery


def post(space_slug: str, secret: str, payload, *, path: str = "", stamp: int | None = None, sig: str | None = None,
         raw: bytes | None = None):
    body = raw if raw is not None else json.dumps(payload).encode()
    stamp = int(time.time()) if stamp is None else stamp
    headers = {"HTTP_X_VERONICA_TIMESTAMP": str(stamp),
               "HTTP_X_VERONICA_SIGNATURE": sig if sig is not None else webhooks.sign(secret, stamp, body)}
    url = f"/api/spaces/{space_slug}/{path}webhook/"
    return Client(enforce_csrf_checks=True).post(url, data=body, content_type="application/json", **headers)


@pytest.fixture
def secret(world):
    return webhooks.rotate_secret(world.space, actor="test")


def test_a_signed_delivery_mails_the_member_and_wakes_it(world, secret, django_capture_on_commit_callbacks, monkeypatch):
    woken = []
    monkeypatch.setattr("veronica.engine.wakes.enqueue_wake", lambda member_id, source: woken.append((member_id, source)))
    with django_capture_on_commit_callbacks(execute=True):
        response = post("alpha", secret, {"to": "w1", "subject": "CI failed", "body": "main is red: test_x"})
    assert response.status_code == 202, response.content
    msg = Message.objects.get(subject="CI failed")
    assert (msg.sender_name, msg.recipient_name, msg.body) == ("webhook", "w1", "main is red: test_x")
    w1 = Member.objects.get(space=world.space, name="w1")
    assert woken == [(w1.pk, "message")]
    assert response.json() == {"delivered": [{"id": msg.pk, "to": "w1"}]}


def test_a_role_and_the_per_member_address_both_reach_one_member(world, secret):
    assert post("alpha", secret, {"to": "leader", "body": "pager: disk 91%"}).status_code == 202
    assert Message.objects.get(body="pager: disk 91%").recipient_name == "boss"
    assert post("alpha", secret, {"body": "ticket #12 opened"}, path="members/w2/").status_code == 202
    assert Message.objects.get(body="ticket #12 opened").recipient_name == "w2"
    clash = post("alpha", secret, {"to": "w1", "body": "x"}, path="members/w2/")
    assert clash.status_code == 400 and clash.json()["field"] == "to"


def test_bad_signature_stale_and_missing_headers_are_401_and_deliver_nothing(world, secret, monkeypatch):
    now = 1_700_000_000  # the server's clock, frozen: a slow request cannot move a stamp across the window's edge
    monkeypatch.setattr(webhooks, "clock", lambda: float(now))
    cases = {
        "wrong secret": dict(sig=webhooks.sign("whsec_other", now, b'{"to": "w1", "body": "x"}'), stamp=now),
        "stale": dict(stamp=now - 301),
        "future": dict(stamp=now + 301),
        "no signature": dict(sig="", stamp=now),
    }
    for label, kwargs in cases.items():
        response = post("alpha", secret, {"to": "w1", "body": "x"}, **kwargs)
        assert response.status_code == 401, label
        assert response.json()["field"].startswith("X-Veronica-"), label
    stale = post("alpha", secret, {"to": "w1", "body": "x"}, stamp=now - 1000).json()["error"]
    assert "the limit is 300" in stale
    # a body changed after signing fails the signature
    body = b'{"to": "w1", "body": "x"}'
    tampered = post("alpha", secret, None, raw=b'{"to": "w1", "body": "y"}', sig=webhooks.sign(secret, now, body), stamp=now)
    assert tampered.status_code == 401 and "does not match" in tampered.json()["error"]
    assert not Message.objects.filter(sender_name="webhook").exists()
    for edge in (now - 300, now + 300):  # the window's edges themselves are inside it
        assert post("alpha", secret, {"to": "w1", "body": f"edge {edge}"}, stamp=edge).status_code == 202


def test_a_replayed_delivery_is_409_and_mails_once(world, secret):
    now = int(time.time())
    first = post("alpha", secret, {"to": "w1", "body": "deploy done"}, stamp=now)
    again = post("alpha", secret, {"to": "w1", "body": "deploy done"}, stamp=now)
    assert (first.status_code, again.status_code) == (202, 409)
    assert "already accepted" in again.json()["error"]
    assert Message.objects.filter(body="deploy done").count() == 1
    # the replay guard only needs to remember a signature while its timestamp could pass
    WebhookDelivery.objects.update(received_at=WebhookDelivery.objects.get().received_at.replace(year=2000))
    assert retention.prune_webhook_deliveries() == 1


def test_oversize_unknown_and_malformed_are_clear_4xx(world, secret, settings):
    settings.WEBHOOK_MAX_BYTES = 1024
    big = post("alpha", secret, {"to": "w1", "body": "x" * 2000})
    assert big.status_code == 413 and "the limit is 1024" in big.json()["error"]
    unknown = post("alpha", secret, {"to": "nobody", "body": "x"})
    assert unknown.status_code == 400 and unknown.json()["field"] == "to" and "w1" in unknown.json()["error"]
    assert post("alpha", secret, {"body": "x"}, path="members/ghost/").status_code == 404
    for payload, field in (({"to": "operator", "body": "x"}, "to"), ({"to": "w1"}, "body"), ({"to": "w1", "body": 3}, "body")):
        response = post("alpha", secret, payload)
        assert response.status_code == 400 and response.json()["field"] == field, payload
    not_json = post("alpha", secret, None, raw=b"not json")
    assert not_json.status_code == 400 and not_json.json()["field"] == "json"
    assert Client().get("/api/spaces/alpha/webhook/").status_code == 405
    assert not Message.objects.filter(sender_name="webhook").exists()


def test_a_space_without_a_secret_or_unknown_answers_404_alike(world):
    assert not world.space.webhook_secret
    a = post("alpha", "", {"to": "w1", "body": "x"})
    b = post("nope", "", {"to": "w1", "body": "x"})
    assert a.status_code == b.status_code == 404 and a.json() == b.json()


def test_owners_rotate_the_secret_through_the_api_and_it_is_shown_once(world):
    owner = world.client(world.owner, csrf=True)
    owner.get("/")  # a page sets the csrftoken cookie
    token = owner.cookies["csrftoken"].value
    created = owner.post("/api/spaces/alpha/webhook/secret/", HTTP_X_CSRFTOKEN=token)
    assert created.status_code == 201
    secret = created.json()["secret"]
    assert secret.startswith("whsec_") and created.json()["secret_set"]
    assert post("alpha", secret, {"to": "w1", "body": "with the new secret"}).status_code == 202
    # never again: not in the status, not in the space detail, not in the event
    assert "secret" not in owner.get("/api/spaces/alpha/webhook/secret/").json()
    detail = owner.get("/api/spaces/alpha/").content.decode()
    assert secret not in detail and json.loads(detail)["settings"]["webhook_secret_set"] is True
    assert not any(secret in json.dumps(e.payload) for e in Event.objects.all())
    # rotation retires the old secret at once
    rotated = owner.post("/api/spaces/alpha/webhook/secret/", HTTP_X_CSRFTOKEN=token).json()["secret"]
    assert rotated != secret
    assert post("alpha", secret, {"to": "w1", "body": "old"}).status_code == 401
    assert call(world.client(world.operator), "POST", "/api/spaces/alpha/webhook/secret/").status_code == 403
    assert owner.delete("/api/spaces/alpha/webhook/secret/", HTTP_X_CSRFTOKEN=token).json()["secret_set"] is False
    assert post("alpha", rotated, {"to": "w1", "body": "off"}).status_code == 404


def test_the_manage_page_shows_a_new_secret_once_with_csrf(world):
    owner = world.client(world.owner, csrf=True)
    page = owner.get(reverse("console:manage", args=["alpha"]))
    assert b"Create secret" in page.content
    token = page.cookies["csrftoken"].value if "csrftoken" in page.cookies else owner.cookies["csrftoken"].value
    assert owner.post(reverse("console:manage", args=["alpha"]), {"action": "rotate_webhook"}).status_code == 403  # no CSRF
    shown = owner.post(reverse("console:manage", args=["alpha"]), {"action": "rotate_webhook", "csrfmiddlewaretoken": token})
    secret = Space.objects.get(slug="alpha").webhook_secret
    assert shown.status_code == 200 and secret.encode() in shown.content and "no-store" in shown["Cache-Control"]
    again = owner.get(reverse("console:manage", args=["alpha"]))
    assert secret.encode() not in again.content and b"Rotate secret" in again.content
    cleared = owner.post(reverse("console:manage", args=["alpha"]), {"action": "clear_webhook", "csrfmiddlewaretoken": token})
    assert cleared.status_code == 302 and not Space.objects.get(slug="alpha").webhook_secret
    assert world.client(world.operator).get(reverse("console:manage", args=["alpha"])).status_code == 403


def test_the_admin_masks_the_secret_and_rotates_it_by_action(world, secret):
    root = User.objects.create_superuser("root", "r@example.com", "pw")
    admin = Client()
    admin.force_login(root)
    page = admin.get(reverse("admin:veronica_space_change", args=[world.space.pk])).content.decode()
    assert secret not in page and "(set)" in page and 'name="webhook_secret"' not in page
    done = admin.post(reverse("admin:veronica_space_changelist"),
                      {"action": "rotate_webhook_secret", "_selected_action": [world.space.pk]}, follow=True)
    new = Space.objects.get(pk=world.space.pk).webhook_secret
    assert new != secret and new in done.content.decode()
    assert post("alpha", new, {"to": "w1", "body": "after admin rotation"}).status_code == 202
