"""Creating a space from the console (template or archive) and exporting one."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.core.files.uploadedfile import SimpleUploadedFile

from veronica import portable
from veronica.models import Member, Space, SpaceAccess


@pytest.fixture(autouse=True)
def data_dir(settings, tmp_path):
    settings.DATA_DIR = tmp_path / "data"


def _allow_create(user):
    user.user_permissions.add(Permission.objects.get(codename="add_space", content_type__app_label="veronica"))


def test_staff_create_from_a_template_and_become_owner(world):
    client = world.client(world.staff)
    assert 'id="new-space"' in client.get("/").content.decode()
    page = client.get("/new-space/")
    assert page.status_code == 200 and "demo-team" in page.content.decode()
    response = client.post("/new-space/", {"source": "template", "template": "demo-team", "slug": "team-one"})
    assert response.status_code == 302 and response["Location"] == "/spaces/team-one/"
    space = Space.objects.get(slug="team-one")
    assert set(space.members.values_list("name", flat=True)) == {"lead", "scout", "analyst"}
    assert SpaceAccess.objects.get(space=space, user=world.staff).role == "owner"


def test_a_user_needs_the_permission_to_create(world):
    client = world.client(world.viewer)
    assert 'id="new-space"' not in client.get("/").content.decode()
    assert client.get("/new-space/").status_code == 403
    assert client.post("/new-space/", {"source": "template", "template": "demo-team", "slug": "x"}).status_code == 403
    assert not Space.objects.filter(slug="x").exists()


def test_export_then_upload_makes_an_identical_space_owned_by_the_uploader(world):
    portable.create_from_template("demo-team", "demo")
    staff = world.client(world.staff)
    download = staff.get("/spaces/demo/export/")
    assert download.status_code == 200 and download["Content-Disposition"] == 'attachment; filename="demo.tar.gz"'
    _allow_create(world.viewer)
    client = world.client(world.viewer)
    upload = SimpleUploadedFile("demo.tar.gz", download.content, content_type="application/gzip")
    response = client.post("/new-space/", {"source": "archive", "slug": "demo-copy", "archive": upload})
    assert response.status_code == 302
    copy = Space.objects.get(slug="demo-copy")
    assert SpaceAccess.objects.get(space=copy, user=world.viewer).role == "owner"
    assert client.get("/spaces/demo-copy/export/").content == download.content


def test_a_bad_upload_is_refused_with_the_entry_and_writes_nothing(world):
    import io
    import tarfile

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        info = tarfile.TarInfo("../../escape.toml")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    before = (Space.objects.count(), Member.objects.count())
    response = world.client(world.staff).post("/new-space/", {
        "source": "archive", "slug": "evil", "archive": SimpleUploadedFile("evil.tar.gz", raw.getvalue())})
    assert response.status_code == 400
    assert "archive entry &#x27;../../escape.toml&#x27;" in response.content.decode()
    assert (Space.objects.count(), Member.objects.count()) == before


def test_export_is_for_owners(world):
    assert world.client(world.owner).get("/spaces/alpha/export/").status_code == 200
    assert world.client(world.viewer).get("/spaces/alpha/export/").status_code == 403
    assert world.client(world.stranger).get("/spaces/alpha/export/").status_code == 404
    assert 'id="export-space"' in world.client(world.owner).get("/spaces/alpha/manage/").content.decode()
