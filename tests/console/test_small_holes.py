"""Issue 21.5, the small ones: each bad input is a 4xx naming the field, never a 500 or a traceback."""
from __future__ import annotations

import pytest

from tests.console.test_webhook import post
from veronica import webhooks
from veronica.models import Message, WebhookDelivery


@pytest.mark.parametrize("opener, closer", [("[", "]"), ('{"a":', "}")])
def test_a_webhook_body_nested_5000_deep_is_a_400_naming_json(world, opener, closer):
    secret = webhooks.rotate_secret(world.space, actor="test")
    body = ('{"to": "w1", "body": "x", "deep": ' + opener * 5000 + "1" + closer * 5000 + "}").encode()
    response = post("alpha", secret, None, raw=body)
    assert response.status_code == 400, response.content[:300]
    assert response.json()["field"] == "json" and "deeper than" in response.json()["error"]
    assert not Message.objects.filter(sender_name="webhook").exists() and not WebhookDelivery.objects.exists()


@pytest.mark.parametrize("url", ["/login/", "/admin/login/"])
def test_a_1mb_login_username_is_a_form_error_not_a_500(world, client, url):
    from tests.console.conftest import PASSWORD

    response = client.post(url, {"username": "u" * 1_000_000, "password": PASSWORD})
    assert response.status_code in (200, 400), response.status_code
    assert b"Traceback" not in response.content
    assert "at most 150 characters" in response.content.decode()
    from axes.models import AccessAttempt

    assert not AccessAttempt.objects.exists()  # refused before anything authenticated


def test_the_lockout_page_says_when_to_retry(world, client, settings):
    settings.AXES_FAILURE_LIMIT = 2
    world.viewer.set_password("right one")
    world.viewer.save()
    for _ in range(2):
        client.post("/login/", {"username": "viewer", "password": "wrong"})
    locked = client.post("/login/", {"username": "viewer", "password": "right one"})
    assert locked.status_code == 429 and b"Too many failed logins" in locked.content
    assert locked["Retry-After"] == str(int(settings.AXES_COOLOFF_TIME * 3600))  # hours in the setting
