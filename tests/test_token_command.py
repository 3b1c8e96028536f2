"""`manage.py token`: the command line makes tokens with the same expiry and scope as the page and API."""
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client

from veronica.models import ApiToken


def run(*args) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("token", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.mark.django_db
def test_create_a_read_only_expiring_token_list_and_revoke_it():
    User.objects.create_user("ci")
    key, note = run("create", "ci", "nightly", "--days", "30", "--read-only")
    key = key.strip()
    token = ApiToken.objects.get(name="nightly")
    assert key.startswith("vrn_") and token.read_only and token.expires_at is not None
    assert "read-only" in note and "expires" in note
    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert client.get("/api/tokens/").status_code == 200
    assert client.post("/api/spaces/x/halt/").status_code == 403
    listing, _ = run("list", "ci")
    assert f"#{token.pk}" in listing and "live" in listing
    run("revoke", "ci", str(token.pk))
    assert client.get("/api/tokens/").status_code == 401


@pytest.mark.django_db
@pytest.mark.parametrize("args, field", [(("--days", "0"), "expires_in_days"), (("--days", "9" * 5000), "expires_in_days")])
def test_bad_input_is_a_command_error_naming_the_field(args, field):
    User.objects.create_user("ci")
    with pytest.raises(CommandError, match=field):
        run("create", "ci", "x", *args)
    with pytest.raises(CommandError, match="no user"):
        run("create", "ghost", "x")
    assert not ApiToken.objects.exists()
