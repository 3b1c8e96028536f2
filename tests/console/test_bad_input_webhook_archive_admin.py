"""Webhook payloads, imported archives and admin forms that 500."""
from __future__ import annotations

import io
import tarfile

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from tests.bad_input import NUL, SURROGATE, changed_tables, db_state
from tests.console.test_portable_console import _valid_files
from tests.console.test_webhook import post
from veronica.ops import webhooks
from veronica.models import Space


@pytest.fixture
def secret(world):
    return webhooks.rotate_secret(world.space, actor="test")


@pytest.mark.parametrize("payload, path, field", [
    ({"to": f"w1{NUL}", "body": "x"}, "", "to"),
    ({"to": f"w1{SURROGATE}", "body": "x"}, "", "to"),
    ({"body": "x"}, "members/w1%00/", "name"),
])
def test_a_signed_webhook_with_unstorable_text_is_a_400(world, secret, payload, path, field):
    before = db_state()
    response = post("alpha", secret, payload, path=path)
    assert 400 <= response.status_code < 500, response.status_code
    assert response.json().get("field") == field, response.json()
    assert not changed_tables(before, db_state())


@pytest.mark.parametrize("extra", [b"skills/ex\xfftra.md", b"members/sc\xffout/member.toml"])
def test_an_archive_with_an_undecodable_file_name_is_a_400(world, settings, tmp_path, extra):
    settings.DATA_DIR = tmp_path / "data"
    files = {**_valid_files(), extra.decode("utf-8", "surrogateescape"): b"body\n"}
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz", format=tarfile.GNU_FORMAT) as tar:  # raw bytes in the name
        for name, body in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
        folder = tarfile.TarInfo("workspace")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
    response = world.client(world.staff).post("/new-space/", {
        "source": "archive", "slug": "odd", "archive": SimpleUploadedFile("x.tar.gz", raw.getvalue())})
    assert response.status_code == 400, response.status_code
    assert not Space.objects.filter(slug="odd").exists()


def test_the_admin_mcp_server_form_refuses_a_nul_in_the_command(world):
    world.staff.is_superuser = True
    world.staff.save()
    before = db_state()
    response = world.client(world.staff).post("/admin/veronica/mcpserver/add/", {
        "space": world.space.pk, "name": "srv", "transport": "stdio", "command": '["a\\u0000"]', "url": "", "timeout": "30"})
    assert response.status_code == 200, response.status_code
    assert "command" in response.context["adminform"].form.errors
    assert not changed_tables(before, db_state())


@pytest.mark.parametrize("name,command,error", [("srv", '["python3", "-m", "server"]', None), ("Bad Name!", '["python3"]', "name"),
                                                ("srv", '"python3"', "command")])
def test_the_admin_mcp_server_form_checks_like_the_console(world, name, command, error):
    from veronica.models import McpServer

    world.staff.is_superuser = True
    world.staff.save()
    response = world.client(world.staff).post("/admin/veronica/mcpserver/add/", {
        "space": world.space.pk, "name": name, "transport": "stdio", "command": command, "url": "", "timeout": "30"})
    if error is None:
        assert response.status_code == 302 and McpServer.objects.get().command == ["python3", "-m", "server"]
    else:
        assert response.status_code == 200 and error in response.context["adminform"].form.errors
        assert not McpServer.objects.exists()
