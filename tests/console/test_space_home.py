"""Where a space's files live is the server's decision: $VERONICA_DATA_DIR/spaces/<slug>/workspace.

Attacked through the doors a tenant has (the console's New space, an archive given to `register`),
as the issue's attacker did: an archive whose space.toml says `workdir = "/"` made the sandbox bind
the host's root read-write at /workspace, and a command there read the data folder's secret key.
Also: templates are copied from a pristine source, the demo runs on its own copy, a space is named
at creation, and an archive's headers and a manifest's TOML are bounded before they cost memory.
"""
from __future__ import annotations

import gzip
import io
import secrets
import shutil
import tarfile
import tracemalloc
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.core.management.base import CommandError

from tests.conftest import REPO
from veronica.portable import archive as portable
from veronica.agent.tools import ToolContext
from veronica.agent.tools import workspace as ws
from veronica.engine import supervisor
from veronica.plumbing.errors import VeronicaError
from veronica.portable import manifest
from veronica.portable.manifest import ManifestError, register
from veronica.models import Member, Space


@pytest.fixture(autouse=True)
def data_dir(settings, tmp_path) -> Path:
    """A data folder of the test's own, holding a secret key as the real one does."""
    settings.DATA_DIR = tmp_path / "data"
    settings.DATA_DIR.mkdir()
    (settings.DATA_DIR / "secret_key").write_text(f"SECRET-{secrets.token_hex(8)}")
    return settings.DATA_DIR


@pytest.fixture
def maker(world):
    """A user allowed to create spaces, not staff: the attacker of issue 21."""
    world.viewer.user_permissions.add(Permission.objects.get(codename="add_space", content_type__app_label="veronica"))
    return world.client(world.viewer)


def _archive(space_toml: str, extra: dict[str, bytes] | None = None) -> bytes:
    """The demo template's export with this space.toml (and any extra entries)."""
    files = _files(portable.export_archive(_victim()))
    files["space.toml"] = space_toml.encode()
    files.update(extra or {})
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, body in sorted(files.items()):
            info = tarfile.TarInfo(name)
            if body is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
    return raw.getvalue()


def _files(data: bytes) -> dict[str, bytes | None]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: (tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()}


def _victim() -> Space:
    """Another tenant's space, made the ordinary way."""
    return Space.objects.filter(slug="victim").first() or portable.create_from_template("demo-team", "victim")


def _upload(client, data: bytes, slug: str, **form):
    return client.post("/new-space/", {"source": "archive", "slug": slug, "archive": SimpleUploadedFile(f"{slug}.tar.gz", data),
                                       **form})


def _sandbox(space: Space, command: str) -> str:
    return ws.run_command(ToolContext(member=supervisor.get_member(space, "lead"), space=space), {"command": command})


def _hostile_workdirs(data_dir: Path) -> dict[str, str]:
    victim = Path(_victim().workdir)
    return {"root": "/", "up": "../..", "data folder": str(data_dir), "another space": str(victim),
            "another space, relative": "../victim/workspace", "the folder itself": ".", "out and back": "workspace/../.."}


@pytest.mark.parametrize("kind", ["root", "up", "data folder", "another space", "another space, relative",
                                  "the folder itself", "out and back"])
def test_an_uploaded_archive_with_a_hostile_workdir_is_refused_and_the_sandbox_never_sees_the_data_folder(
        maker, data_dir, kind):
    secret = (data_dir / "secret_key").read_text()
    workdir = _hostile_workdirs(data_dir)[kind]
    before = (Space.objects.count(), Member.objects.count())
    response = _upload(maker, _archive(f'name = "Evil"\nworkdir = "{workdir}"\n'), "evil")
    created = Space.objects.filter(slug="evil").first()
    if created is not None:  # what the attacker did next: read the secret through the bind
        leaked = _sandbox(created, f"cat /workspace{data_dir}/secret_key /workspace/data/secret_key /workspace/secret_key "
                                   "/workspace/../../secret_key 2>/dev/null")
        pytest.fail(f"workdir {workdir!r} was accepted: the space works in {created.workdir}"
                    + ("; the sandbox read the secret key" if secret in leaked else ""))
    assert response.status_code == 400
    page = response.content.decode()
    assert "space.toml: workdir:" in page and "its own folder on the server" in page, page
    assert (Space.objects.count(), Member.objects.count()) == before
    assert not (data_dir / "spaces" / "evil").exists()


def test_an_uploaded_space_works_in_its_own_folder_and_its_commands_cannot_reach_the_data_folder(maker, data_dir):
    secret = (data_dir / "secret_key").read_text()
    response = _upload(maker, _archive('name = "Mine"\nworkdir = "workspace"\n', {"workspace/notes.md": b"hello\n"}), "mine")
    assert response.status_code == 302
    space = Space.objects.get(slug="mine")
    home = data_dir / "spaces" / "mine"
    assert Path(space.workdir) == home / "workspace" and (home / "workspace" / "notes.md").read_text() == "hello\n"
    assert Path(space.manifest_path) == home
    out = _sandbox(space, "ls -a /workspace; cat /workspace/../secret_key /workspace/../../secret_key; "
                          "find / -name secret_key 2>/dev/null; echo done")
    assert "notes.md" in out and "done" in out and "secret_key" not in out.replace("/secret_key: No such", "")
    assert secret not in out
    # the copy's space.toml says what the server decided, so an admin's register of it refreshes this space
    assert 'slug = "mine"' in (home / "space.toml").read_text() and "workdir" not in (home / "space.toml").read_text()
    call_command("register", str(home), stdout=io.StringIO())
    space.refresh_from_db()
    assert Path(space.workdir) == home / "workspace"


def test_register_of_an_archive_refuses_a_hostile_workdir(db, data_dir, tmp_path):
    path = tmp_path / "evil.tar.gz"
    path.write_bytes(_archive('name = "Evil"\nworkdir = "/"\n'))
    with pytest.raises(CommandError, match="space.toml: workdir: '/' is refused"):
        call_command("register", str(path), "--slug", "evil")
    assert not Space.objects.filter(slug="evil").exists()
    path.write_bytes(_archive('name = "Ok"\n'))
    call_command("register", str(path), "--slug", "ok", stdout=io.StringIO())
    assert Path(Space.objects.get(slug="ok").workdir) == data_dir / "spaces" / "ok" / "workspace"


@pytest.fixture
def folder(tmp_path, demo_manifest) -> Path:
    dest = tmp_path / "team"
    shutil.copytree(demo_manifest, dest)
    return dest


@pytest.mark.parametrize("workdir", ["/", "../..", "..", ".", "workspace/../..", "/etc"])
def test_register_of_a_folder_keeps_the_workdir_inside_that_folder(db, folder, workdir):
    (folder / "space.toml").write_text(f'name = "Team"\nslug = "team"\nworkdir = "{workdir}"\n')
    with pytest.raises(CommandError, match="space.toml: workdir: .* must be a folder inside the manifest folder"):
        call_command("register", str(folder))
    assert not Space.objects.filter(slug="team").exists()


def test_register_of_a_folder_takes_a_workdir_inside_it_or_the_admins_explicit_one(db, folder, tmp_path):
    (folder / "space.toml").write_text('name = "Team"\nslug = "team"\nworkdir = "src/code"\n')
    call_command("register", str(folder), stdout=io.StringIO())
    space = Space.objects.get(slug="team")
    assert Path(space.workdir) == folder / "src" / "code" and Path(space.workdir).is_dir()  # made when missing
    elsewhere = tmp_path / "project"
    elsewhere.mkdir()
    call_command("register", str(folder), "--workdir", str(elsewhere), stdout=io.StringIO())
    space.refresh_from_db()
    assert Path(space.workdir) == elsewhere


def test_a_link_out_of_the_manifest_folder_is_refused(db, folder, tmp_path):
    (folder / "workspace").rename(folder / "old-workspace")
    (folder / "workspace").symlink_to(tmp_path)
    with pytest.raises(ManifestError, match="space.toml: workdir: 'workspace' must be a folder inside"):
        register(folder)


def test_re_registering_a_space_cannot_move_its_workdir_somewhere_hostile(maker, data_dir):
    assert _upload(maker, _archive('name = "Mine"\n'), "mine").status_code == 302
    space = Space.objects.get(slug="mine")
    home = data_dir / "spaces" / "mine"
    text = (home / "space.toml").read_text()
    (home / "space.toml").write_text(text.replace('slug = "mine"\n', 'slug = "mine"\nworkdir = "/"\n'))
    with pytest.raises(CommandError, match="space.toml: workdir"):
        call_command("register", str(home))
    space.refresh_from_db()
    assert Path(space.workdir) == home / "workspace"
    # a second upload under the same slug never merges into it
    assert _upload(maker, _archive('name = "Again"\n'), "mine").status_code == 409
    space.refresh_from_db()
    assert (space.name, Path(space.workdir)) == ("Mine", home / "workspace")


def test_the_admin_form_cannot_set_a_workdir(world, data_dir):
    from django.contrib.auth.models import User

    admin = User.objects.create_superuser("root-admin")
    client = world.client(admin)
    page = client.get(f"/admin/veronica/space/{world.space.pk}/change/").content.decode()
    assert 'name="workdir"' not in page
    response = client.post("/admin/veronica/space/add/", {
        "name": "From admin", "slug": "from-admin", "workdir": "/", "member_daily_tokens": 0, "daily_token_ceiling": 0,
        "daily_usd_ceiling": 0, "blackboard_cap": 8000, "stale_task_minutes": 0, "retention_days": 0, "spawn_cap": 2,
        "default_permission_mode": "bypass", "stuck_run_minutes": 0, "mailbox_backlog_minutes": 0, "verify_checks": "[]",
        "members-TOTAL_FORMS": 0, "members-INITIAL_FORMS": 0, "access-TOTAL_FORMS": 0, "access-INITIAL_FORMS": 0})
    space = Space.objects.filter(slug="from-admin").first()
    assert space is not None, response.content.decode()[:3000]
    assert Path(space.workdir) == data_dir / "spaces" / "from-admin" / "workspace"


# --- templates: a pristine source; the demo on its own copy; a name at creation --------------------------------

@pytest.fixture
def bundled(settings, tmp_path, monkeypatch) -> Path:
    """The bundled templates as shipped, in a folder of the test's own."""
    examples = tmp_path / "examples"
    shutil.copytree(REPO / "examples", examples)
    monkeypatch.setattr(manifest, "TEMPLATES_DIR", examples)
    return examples


def test_new_space_from_a_template_copies_its_pristine_files_never_a_live_workspace(maker, bundled, data_dir):
    template = bundled / "demo-team"
    (template / "workspace" / ".git").mkdir(parents=True)  # what a space run in the checkout left there
    (template / "workspace" / "left-by-an-agent.bin").write_bytes(b"x" * 4096)
    (template / "workspace" / "inventory").mkdir(exist_ok=True)
    (template / "workspace" / "inventory" / "models.py").write_text("# an agent's edit\n")
    response = maker.post("/new-space/", {"source": "template", "template": "demo-team", "slug": "fresh"})
    assert response.status_code == 302
    workdir = Path(Space.objects.get(slug="fresh").workdir)
    assert workdir == data_dir / "spaces" / "fresh" / "workspace"
    shipped = sorted(p.relative_to(template / "starter") for p in (template / "starter").rglob("*"))
    assert sorted(p.relative_to(workdir) for p in workdir.rglob("*")) == shipped
    assert (workdir / "inventory" / "models.py").read_text() == (template / "starter" / "inventory" / "models.py").read_text()
    assert not (data_dir / "spaces" / "fresh" / "starter").exists()


def test_a_bundled_template_is_never_registered_in_place(db, bundled):
    with pytest.raises(CommandError, match="a bundled template is never registered in place"):
        call_command("register", str(bundled / "demo-team"))
    assert not (bundled / "demo-team" / "workspace").exists()
    call_command("register", "--template", "demo-team", "--slug", "from-cli", "--name", "From the CLI", stdout=io.StringIO())
    space = Space.objects.get(slug="from-cli")
    assert space.name == "From the CLI" and (Path(space.workdir) / "inventory" / "models.py").is_file()


def test_the_demo_space_works_on_its_own_copy_never_inside_the_checkout(db, data_dir):
    from veronica.portable.startup import ensure_demo_space

    space = ensure_demo_space()
    assert Path(space.workdir) == data_dir / "spaces" / "demo" / "workspace"
    assert (Path(space.workdir) / "inventory" / "store.py").is_file()
    assert not Path(space.workdir).resolve().is_relative_to(REPO)
    assert ensure_demo_space().pk == space.pk


def test_a_demo_an_earlier_version_ran_in_the_checkout_moves_to_its_own_copy(db, data_dir, bundled):
    from veronica.portable.startup import ensure_demo_space

    old = bundled / "demo-team" / "workspace"  # the earlier layout: the demo ran in the template's workspace/
    old.mkdir(exist_ok=True)
    (old / "agent-notes.md").write_text("left behind\n")
    space = Space.objects.create(name="Demo team", slug="demo", workdir=str(old), manifest_path=str(bundled / "demo-team"))
    supervisor.add_member(space, "lead", role="leader", actor="test")
    supervisor.add_member(space, "helper", actor="op")  # an operator's change survives the move
    moved = ensure_demo_space()
    assert moved.pk == space.pk
    assert Path(moved.workdir) == data_dir / "spaces" / "demo" / "workspace"
    assert (Path(moved.workdir) / "inventory" / "store.py").is_file() and not (Path(moved.workdir) / "agent-notes.md").exists()
    assert supervisor.get_member(moved, "helper").removed_at is None


def test_a_new_space_is_named_at_creation(maker, data_dir):
    response = maker.post("/new-space/", {"source": "template", "template": "demo-team", "slug": "named", "name": "  Team Rocket "})
    assert response.status_code == 302
    assert Space.objects.get(slug="named").name == "Team Rocket"
    assert 'name = "Team Rocket"' in (data_dir / "spaces" / "named" / "space.toml").read_text()  # a re-register keeps it
    assert maker.post("/new-space/", {"source": "template", "template": "demo-team", "slug": "unnamed"}).status_code == 302
    assert Space.objects.get(slug="unnamed").name == "Demo team"  # blank: the manifest's
    assert _upload(maker, _archive('name = "Archive name"\n'), "upload", name="Uploaded").status_code == 302
    assert Space.objects.get(slug="upload").name == "Uploaded"
    before = Space.objects.count()
    response = maker.post("/new-space/", {"source": "template", "template": "demo-team", "slug": "long", "name": "n" * 121})
    assert response.status_code == 400 and "name: is 121 characters; the limit is 120" in response.content.decode()
    assert Space.objects.count() == before and not (data_dir / "spaces" / "long").exists()
    assert 'name="name"' in maker.get("/new-space/").content.decode()


# --- archive headers are bounded before they are read -------------------------------------------------------------

class _Repeat(io.RawIOBase):
    """`size` bytes of one letter, made as they are read (the test never holds them whole)."""

    def __init__(self, size: int) -> None:
        self.left = size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        self.left -= n
        return b"a" * n


def _header_bomb(kind: bytes, size: int) -> bytes:
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo("././@LongLink" if kind == tarfile.GNUTYPE_LONGNAME else "./PaxHeaders/x")
        info.type, info.size = kind, size
        tar.addfile(info, _Repeat(size))
        info = tarfile.TarInfo("space.toml")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"\n"))
    return raw.getvalue()


@pytest.mark.parametrize("kind", [tarfile.GNUTYPE_LONGNAME, tarfile.XHDTYPE, tarfile.XGLTYPE],
                         ids=["gnu long name", "pax", "pax global"])
def test_an_archives_long_name_or_pax_header_is_bounded_before_it_is_read(db, kind):
    data = _header_bomb(kind, 30 * 1024 * 1024)
    assert len(data) < 100_000
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        with pytest.raises(VeronicaError) as err:
            portable.create_from_archive(data, "bomb")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 5 * 1024 * 1024, f"peak {peak / 2**20:.1f} MiB for a {len(data)}-byte upload"
    assert f"of {30 * 1024 * 1024} bytes; the limit is {portable.MAX_HEADER_BYTES}" in err.value.message
    assert not Space.objects.filter(slug="bomb").exists()


def test_a_chain_of_small_extended_headers_is_refused_not_a_500(maker):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz", format=tarfile.GNU_FORMAT) as tar:
        for i in range(2000):  # tarfile recurses once per header: RecursionError without a bound
            info = tarfile.TarInfo("././@LongLink")
            info.type, info.size = tarfile.GNUTYPE_LONGNAME, 10
            tar.addfile(info, io.BytesIO(b"name%06d" % i))
        info = tarfile.TarInfo("space.toml")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"\n"))
    response = _upload(maker, raw.getvalue(), "chain")
    assert response.status_code == 400 and "in a row" in response.content.decode()


# --- TOML that would crash the parser, and manifest fields the database refuses ----------------------------------

DEEP = "x = " + "[" * 5000 + "]" * 5000 + "\n"
DEEP_INLINE = "x = " + "{a = " * 5000 + "1" + "}" * 5000 + "\n"
HUGE_INT = "[settings]\nspawn_cap = " + "9" * 5000 + "\n"

BAD_MANIFESTS = [
    ("nested arrays", 'name = "x"\n' + DEEP, "space.toml: x: line 2: arrays or inline tables nested too deep"),
    ("nested tables", 'name = "x"\n' + DEEP_INLINE, "space.toml: x: line 2: arrays or inline tables nested too deep"),
    ("5000-digit integer", 'name = "x"\n' + HUGE_INT, "space.toml: spawn_cap: line 3: an integer of more than 4300 digits"),
    ("blackboard_cap below the column's check", 'name = "x"\n[settings]\nblackboard_cap = 9\n',
     "space.toml: settings.blackboard_cap: is 9; it must be from 100 to 1000000"),
    ("unknown top-level key", 'name = "x"\nworkdirr = "workspace"\n', "space.toml: workdirr: unknown key"),
]


@pytest.mark.parametrize("label, text, needle", BAD_MANIFESTS, ids=[c[0] for c in BAD_MANIFESTS])
def test_a_hostile_space_toml_in_an_upload_is_a_manifest_error_never_a_500(maker, label, text, needle):
    response = _upload(maker, _archive(text), "toml")
    assert response.status_code == 400, response.content.decode()[:500]
    assert needle in response.content.decode()
    assert not Space.objects.filter(slug="toml").exists()


@pytest.mark.parametrize("label, text, needle", BAD_MANIFESTS, ids=[c[0] for c in BAD_MANIFESTS])
def test_a_hostile_toml_in_a_manifest_folder_is_a_manifest_error(db, folder, label, text, needle):
    (folder / "space.toml").write_text(text)
    with pytest.raises(ManifestError) as err:
        register(folder)
    assert needle.removeprefix("space.toml") in err.value.message and "space.toml" in err.value.message
    scout = folder / "members" / "scout" / "member.toml"
    (folder / "space.toml").write_text('name = "x"\n')
    scout.write_text('model = "offline"\nbudget = ' + "1" * 5000 + "\n")
    with pytest.raises(ManifestError, match=r"member.toml: budget: line 2: an integer of more than 4300 digits"):
        register(folder)
    assert not Space.objects.exists()


@pytest.mark.parametrize("kind", ["root", "data folder"])
def test_the_attackers_route_an_mcp_servers_check_never_prints_the_secret_key(maker, data_dir, kind):
    """Issue 21's exact route: upload with a hostile workdir, attach an MCP server that cats the
    key to stderr, press Check on the manage page. The upload is refused; the same route in a space
    that was let in (its own folder) shows no secret either."""
    from veronica.agent.mcp_client import manager

    secret = (data_dir / "secret_key").read_text()
    workdir = _hostile_workdirs(data_dir)[kind]
    response = _upload(maker, _archive(f'name = "Evil"\nworkdir = "{workdir}"\n'), "evil")
    slug = "evil" if Space.objects.filter(slug="evil").exists() else "mine"
    if slug == "mine":
        assert response.status_code == 400
        assert _upload(maker, _archive('name = "Mine"\n'), "mine").status_code == 302
    paths = " ".join(f"/workspace{p}/secret_key" for p in ("", "/..", "/../..", str(data_dir), "/data"))
    command = f"sh -c 'ls -a /workspace >&2; cat {paths} >&2; exit 1'"
    try:
        maker.post(f"/spaces/{slug}/manage/", {"action": "add_mcp", "name": "peek", "command": command, "timeout": "10"})
        page = maker.post(f"/spaces/{slug}/manage/", {"action": "check_mcp", "name": "peek"}).content.decode()
    finally:
        manager().close_all()
    assert "could not start" in page or "peek" in page, page[:2000]
    assert secret not in page, f"the Check printed the secret key of the data folder (workdir {workdir!r})"
    assert slug == "mine", f"workdir {workdir!r} was accepted"
