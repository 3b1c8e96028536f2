"""Creating a space from the console (template or archive) and exporting one."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.core.files.uploadedfile import SimpleUploadedFile

from veronica.portable import archive as portable
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


# --- access checks, CSRF, hostile uploads ------------------------------------------------------------------

@pytest.mark.parametrize("url", ["/new-space/", "/spaces/alpha/export/", "/spaces/alpha/usage/", "/spaces/alpha/runs/1/"])
def test_anonymous_visitors_are_sent_to_log_in(world, url):
    response = world.client(None).get(url)
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_export_is_refused_to_operators_and_to_another_spaces_owner(world):
    assert world.client(world.operator).get("/spaces/alpha/export/").status_code == 403
    assert world.client(world.stranger).get("/spaces/alpha/export/").status_code == 404  # owner of beta only
    assert world.client(world.stranger).get("/spaces/beta/export/").status_code == 200


def test_usage_and_run_pages_are_for_members_of_that_space_only(world):
    from veronica.engine import slot, supervisor

    lease = slot.claim(supervisor.get_member(world.other, "x1"), "message")  # a run of beta
    assert world.client(world.stranger).get(f"/spaces/beta/runs/{lease.run.pk}/").status_code == 200
    assert world.client(world.viewer).get(f"/spaces/beta/runs/{lease.run.pk}/").status_code == 404
    assert world.client(world.viewer).get(f"/spaces/alpha/runs/{lease.run.pk}/").status_code == 404  # not alpha's
    assert world.client(world.viewer).get("/spaces/beta/usage/").status_code == 404
    assert world.client(world.viewer).get("/spaces/alpha/usage/").status_code == 200


def test_creating_a_space_needs_the_csrf_token(world):
    client = world.client(world.staff, csrf=True)
    form = {"source": "template", "template": "demo-team", "slug": "csrf-one"}
    assert client.post("/new-space/", form).status_code == 403
    assert not Space.objects.filter(slug="csrf-one").exists()
    page = client.get("/new-space/")
    response = client.post("/new-space/", {**form, "csrfmiddlewaretoken": page.context["csrf_token"]})
    assert response.status_code == 302 and Space.objects.filter(slug="csrf-one").exists()


def _tar(entries) -> bytes:
    import io
    import tarfile

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, body, kind in entries:
            info = tarfile.TarInfo(name)
            if kind is None:
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
            elif kind == tarfile.DIRTYPE:
                info.type = kind
                tar.addfile(info)
            else:
                info.type, info.linkname = kind, "/etc/passwd"
                tar.addfile(info)
    return raw.getvalue()


def _valid_files() -> dict[str, bytes]:
    import io
    import tarfile

    space = portable.create_from_template("demo-team", "source")
    with tarfile.open(fileobj=io.BytesIO(portable.export_archive(space)), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def _bad(kind: str) -> tuple[bytes, str]:
    import tarfile

    if kind == "bomb":
        return _tar([("space.toml", b"name = 'x'\n", None), ("workspace/zeros", b"\0" * (portable.MAX_UNPACKED_BYTES + 1), None)]), \
            "archive entry &#x27;workspace/zeros&#x27;: the archive unpacks to more than"
    if kind == "traversal":
        return _tar([("members/../../x.toml", b"x", None)]), "archive entry &#x27;members/../../x.toml&#x27;"
    if kind == "symlink":
        return _tar([("space.toml", b"", tarfile.SYMTYPE)]), "archive entry &#x27;space.toml&#x27;: only plain files"
    if kind == "not-a-tar":
        return b"PK\x03\x04 a zip, not a tar", "not a readable tar"
    files = _valid_files()
    files["members/scout/member.toml"] = b"role = 'worker'\nmax_iterations = 0\n"
    return _tar([(n, b, None) for n, b in files.items()] + [("workspace", b"", tarfile.DIRTYPE)]), "members/scout/member.toml: max_iterations: must be an integer from 1 to 200"


@pytest.mark.parametrize("kind", ["bomb", "traversal", "symlink", "not-a-tar", "bad-toml"])
def test_a_hostile_or_broken_upload_is_a_400_naming_the_problem_and_writes_nothing(world, settings, kind):
    data, needle = _bad(kind)
    before = (Space.objects.count(), Member.objects.count(), SpaceAccess.objects.count())
    response = world.client(world.staff).post("/new-space/", {
        "source": "archive", "slug": "hostile", "archive": SimpleUploadedFile("x.tar.gz", data)})
    assert response.status_code == 400
    assert needle in response.content.decode()
    assert (Space.objects.count(), Member.objects.count(), SpaceAccess.objects.count()) == before
    assert not (settings.DATA_DIR / "spaces" / "hostile").exists()


def test_an_oversized_upload_is_refused_before_it_is_read(world, monkeypatch):
    from django.http.request import HttpRequest

    monkeypatch.setattr(portable, "MAX_ARCHIVE_BYTES", 1000)
    def never(self):
        raise AssertionError("the oversized body was parsed")
    monkeypatch.setattr(HttpRequest, "_load_post_and_files", never)
    response = world.client(world.staff, csrf=True).post("/new-space/", {
        "source": "archive", "slug": "huge", "archive": SimpleUploadedFile("x.tar.gz", b"\0" * 200_000)})
    assert response.status_code == 400 and "an archive may be at most 1000" in response.content.decode()
    assert not Space.objects.filter(slug="huge").exists()
