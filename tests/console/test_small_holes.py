"""Issue 21.5, the small ones: each bad input is a 4xx naming the field, never a 500 or a traceback."""
from __future__ import annotations

import pytest

from tests.console.test_webhook import post
from veronica.ops import webhooks
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


def admin_form_data(response) -> dict:
    """What the admin change page would post back unchanged: the form's fields and every inline's."""
    data = {}
    forms = [response.context["adminform"].form]
    for inline in response.context["inline_admin_formsets"]:
        formset = inline.formset
        forms += [formset.management_form, *formset.forms]
    for form in forms:
        for bound in form:
            value = bound.value()
            if value is None or value is False:
                continue
            data[bound.html_name] = "on" if value is True else value
    return data


@pytest.mark.parametrize("cap", ["1", "9", "99", "0", "-5", "1000001"])
def test_the_admin_refuses_a_blackboard_cap_the_database_would_refuse_naming_the_field(world, cap):
    world.staff.is_superuser = True
    world.staff.save()
    client = world.client(world.staff)
    url = f"/admin/veronica/space/{world.space.pk}/change/"
    data = {**admin_form_data(client.get(url)), "blackboard_cap": cap}
    response = client.post(url, data)
    assert response.status_code == 200, response.status_code
    errors = response.context["adminform"].form.errors
    assert "blackboard_cap" in errors and "between 100 and 1000000" in errors["blackboard_cap"][0], errors
    world.space.refresh_from_db()
    assert world.space.blackboard_cap == 8000


def test_the_admin_saves_a_blackboard_cap_in_range(world):
    world.staff.is_superuser = True
    world.staff.save()
    client = world.client(world.staff)
    url = f"/admin/veronica/space/{world.space.pk}/change/"
    response = client.post(url, {**admin_form_data(client.get(url)), "blackboard_cap": "100"})
    assert response.status_code == 302, response.context["adminform"].form.errors if response.context else response
    world.space.refresh_from_db()
    assert world.space.blackboard_cap == 100


def test_the_shared_cap_check_names_the_field_and_limits():
    from veronica.swarm.blackboard import clean_cap
    from veronica.plumbing.errors import VeronicaError

    for bad in (1, 9, 99, 1_000_001, "500", 3.5, True, None):
        with pytest.raises(VeronicaError) as err:
            clean_cap(bad)
        assert err.value.field == "blackboard_cap" and "100" in str(err.value)
    assert clean_cap(100) == 100 and clean_cap(1_000_000) == 1_000_000


EMBEDDED_INTERNAL = ["http://[2002:7f00:1::]/", "http://[2002:a9fe:a9fe::1]/latest/meta-data/", "http://[2002:c0a8:1::]:8080/",
                     "http://[64:ff9b::7f00:1]/", "http://[64:ff9b::a9fe:a9fe]/", "http://[64:ff9b::a00:1]/",
                     "http://[64:ff9b:1::808:808]/", "http://[::127.0.0.1]/"]


@pytest.mark.parametrize("url", EMBEDDED_INTERNAL)
def test_6to4_and_nat64_forms_of_internal_addresses_are_refused(world, settings, url):
    from tests.console.helpers import call
    from veronica.models import Space

    settings.NOTIFY_ALLOW_HOSTS = []
    response = call(world.client(world.owner), "PUT", "/api/spaces/alpha/notify/", {"webhook_url": url})
    assert response.status_code == 400, (url, response.content)
    assert response.json()["field"] == "webhook_url" and "internal address" in response.json()["error"]
    assert Space.objects.get(pk=world.space.pk).notify_webhook_url == ""


def test_6to4_and_nat64_forms_of_public_addresses_pass_and_the_allow_list_covers_the_embedded_address(settings):
    import ipaddress

    from veronica.ops import outbound

    for public in ("2002:808:808::1", "64:ff9b::808:808", "2606:4700::1111"):
        assert not outbound.internal(ipaddress.ip_address(public)), public
    settings.NOTIFY_ALLOW_HOSTS = ["127.0.0.1"]
    assert outbound.checked_addresses("2002:7f00:1::", 80, "url", must_resolve=False) == [ipaddress.ip_address("2002:7f00:1::")]


SECRET_COMMAND = "curl -H 'Authorization: Bearer sk-live-123' http://10.0.0.5/ci"


@pytest.fixture
def checked_task(world):
    from veronica.swarm import ledger
    from veronica.engine import checks
    from veronica.models import TaskCheck

    checks.configure(world.space, [{"name": "ci", "command": SECRET_COMMAND, "timeout": 30}], actor="test")
    task = ledger.create_task(world.space, "boss", "a job")
    TaskCheck.objects.create(task=task, space=world.space, name="ci", command=SECRET_COMMAND, exit_code=1, output="boom")
    return task


def test_viewers_do_not_see_verify_check_commands_on_the_task_page_or_api(world, checked_task):
    client = world.client(world.viewer)
    page = client.get(f"/spaces/alpha/tasks/{checked_task.pk}/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "sk-live-123" not in text and "10.0.0.5" not in text
    assert 'data-check="ci"' in text and "boom" in text  # the verdict and output stay
    api = client.get(f"/api/spaces/alpha/tasks/{checked_task.pk}/")
    assert api.status_code == 200 and "sk-live-123" not in api.content.decode()
    assert api.json()["check_results"][0]["checks"][0]["name"] == "ci"
    assert client.get("/api/spaces/alpha/checks/").status_code == 403


@pytest.mark.parametrize("who", ["operator", "owner"])
def test_operators_and_owners_still_see_the_commands(world, checked_task, who):
    client = world.client(getattr(world, who))
    assert "sk-live-123" in client.get(f"/spaces/alpha/tasks/{checked_task.pk}/").content.decode()
    assert client.get(f"/api/spaces/alpha/tasks/{checked_task.pk}/").json()["check_results"][0]["checks"][0]["command"] == SECRET_COMMAND
