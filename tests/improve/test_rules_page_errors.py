"""The rules page never shows an internal error's text (issue 9 item 5): a database's or the ORM's
message stays in the log; the page says which action failed."""
import pytest
from django.contrib.messages import get_messages
from django.db import DataError
from django.urls import reverse

from learning.models import Rule
from veronica.web import views_improve
from veronica.models import AccessRole, SpaceAccess

INTERNALS = ("PostgreSQL text fields cannot contain NUL", "matching query does not exist", "Traceback", "DataError")


@pytest.fixture
def owner(client, django_user_model, space):
    user = django_user_model.objects.create_user("owner")
    SpaceAccess.objects.create(user=user, space=space, role=AccessRole.OWNER)
    client.force_login(user)
    return user


def shown(response) -> str:
    return " | ".join(str(m) for m in get_messages(response.wsgi_request))


@pytest.mark.parametrize("internal", [
    DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes"),
    Rule.DoesNotExist("Rule matching query does not exist."),
])
def test_an_internal_error_is_a_field_named_message_without_its_text(client, owner, space, monkeypatch, internal):
    def fail(request, space, role):
        raise internal

    monkeypatch.setattr(views_improve, "_rules_action", fail)
    response = client.post(reverse("console:rules", args=[space.slug]), {"action": "add_rule", "domain": "ops", "text": "x"})
    assert response.status_code == 500  # the page again, with a safe message; the details go to the log
    text = shown(response)
    assert text.startswith("action: add_rule could not be done") and not any(s in text for s in INTERNALS), text


def test_a_nul_in_a_rule_is_never_a_500_or_an_internal_message(client, owner, space):
    from veronica.models import Member

    Member.objects.filter(space=space, name="w1").update(rule_domains=["ops"])
    response = client.post(reverse("console:rules", args=[space.slug]), {"action": "add_rule", "domain": "ops", "text": "be\x00careful"})
    assert response.status_code == 400
    assert not any(s in shown(response) for s in INTERNALS)
