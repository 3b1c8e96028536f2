"""Portable spaces: export a space as an archive, create one from a template or an archive."""
from __future__ import annotations

import gzip
import io
import tarfile

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

from learning import api as learning
from learning.models import Rule
from veronica.portable import archive as portable
from veronica.engine import supervisor
from veronica.plumbing.errors import VeronicaError
from veronica.swarm.learning_bridge import owner_key
from veronica.portable.manifest import register
from veronica.models import Member, Skill, Space, SpaceAccess


@pytest.fixture
def demo(db, settings, tmp_path):
    settings.DATA_DIR = tmp_path / "data"
    space = portable.create_from_template("demo-team", "demo")
    space.webhook_secret = "s3cret-hook"
    space.save()
    learning.add_user_rule("conduct", "Always cite the file you read.", actor="op", owner=owner_key(space))
    learning.add_user_rule("conduct", "Never push on Fridays.", actor="op", owner=owner_key(space))
    supervisor.set_schedule(supervisor.get_member(space, "scout"), "*/30 * * * *", actor="op")
    return space


def _entries(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: (tar.extractfile(m).read() if m.isfile() else b"") for m in tar.getmembers()}


def test_export_carries_members_skills_rules_schedule_settings_and_scrubs_the_secret(demo):
    data = portable.export_archive(demo)
    files = _entries(data)
    assert "members/lead/persona.md" in files and "members/lead/skills/planning.md" in files
    assert "skills/reporting.md" in files and "workspace" in files
    assert b'"*/30 * * * *"' in files["members/scout/member.toml"]
    assert b"Never push on Fridays." in files["rules/conduct.toml"]
    assert b"blackboard_cap = 6000" in files["space.toml"]
    assert b"s3cret-hook" not in data and b"webhook_secret" not in files["space.toml"]
    assert b"slug" not in files["space.toml"]
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in tar.getmembers()} == {(0, 0, 0, "", "")}
        assert [m.name for m in tar.getmembers()][1:] == sorted(m.name for m in tar.getmembers()[1:])
    assert gzip.decompress(data)  # a plain gzip with a fixed header (mtime 0, no name)
    assert data[4:8] == b"\0\0\0\0"


def test_runtime_state_stays_out(demo):
    lead = supervisor.get_member(demo, "lead")
    supervisor.spawn(supervisor.get_member(demo, "scout"), actor="lead")
    from veronica.models import MemoryFile

    MemoryFile.objects.create(member=lead, name="notes.md", content="private notes")
    files = _entries(portable.export_archive(demo))
    assert not any(name.startswith("members/scout-") for name in files)  # clones are runtime
    assert not any(b"private notes" in body for body in files.values())


def test_round_trip_export_register_export_is_byte_identical(demo, tmp_path):
    first = portable.export_archive(demo)
    copy = portable.create_from_archive(first, "demo-copy")
    assert copy.pk != demo.pk
    assert portable.export_archive(copy) == first
    assert list(Rule.objects.filter(domain__owner=owner_key(copy)).order_by("id").values_list("text", flat=True)) == [
        "Always cite the file you read.", "Never push on Fridays."]
    assert supervisor.get_member(copy, "scout").schedule == "*/30 * * * *"
    assert copy.webhook_secret == ""


def test_manage_export_and_register_archive_commands(demo, tmp_path):
    path = tmp_path / "demo.tar.gz"
    call_command("export", "demo", str(path))
    assert path.read_bytes() == portable.export_archive(demo)
    call_command("register", str(path), "--slug", "demo-two")
    assert portable.export_archive(Space.objects.get(slug="demo-two")) == path.read_bytes()
    with pytest.raises(CommandError, match="no space 'nope'"):
        call_command("export", "nope", str(path))


def test_register_of_a_rules_file_sets_exactly_those_user_rules(demo, tmp_path):
    (tmp_path / "folder").mkdir()
    with tarfile.open(fileobj=io.BytesIO(portable.export_archive(demo)), mode="r:gz") as tar:
        tar.extractall(tmp_path / "folder", filter="data")
    (tmp_path / "folder" / "rules" / "conduct.toml").write_text('rules = ["Never push on Fridays.", "Ask first."]\n')
    register(tmp_path / "folder", slug="demo")
    texts = list(Rule.objects.filter(domain__owner=owner_key(demo)).order_by("id").values_list("text", flat=True))
    assert texts == ["Never push on Fridays.", "Ask first."]


def _tar(entries: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for info, body in entries:
            tar.addfile(info, io.BytesIO(body) if body is not None else None)
    return raw.getvalue()


def _file(name: str, body: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(body)
    return info, body


def _link(name: str, target: str, kind=tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


@pytest.mark.parametrize("entries,needle", [
    ([_file("../evil.txt")], "'../evil.txt'"),
    ([_file("/etc/evil")], "'/etc/evil'"),
    ([_link("space.toml", "/etc/passwd")], "'space.toml': only plain files"),
    ([_link("members", "/tmp", tarfile.LNKTYPE)], "'members': only plain files"),
])
def test_a_bad_archive_entry_is_refused_by_name_and_nothing_is_written(demo, entries, needle):
    before = (Space.objects.count(), Member.objects.count(), Skill.objects.count())
    with pytest.raises(VeronicaError) as err:
        portable.create_from_archive(_tar(entries), "evil")
    assert needle in err.value.message
    assert (Space.objects.count(), Member.objects.count(), Skill.objects.count()) == before


def test_an_archive_over_the_cap_or_not_a_tar_is_refused(demo, monkeypatch):
    monkeypatch.setattr(portable, "MAX_ARCHIVE_BYTES", 100)
    with pytest.raises(VeronicaError, match="the limit is 100"):
        portable.create_from_archive(portable.export_archive(demo), "big")
    monkeypatch.undo()
    with pytest.raises(VeronicaError, match="not a readable tar"):
        portable.create_from_archive(b"hello, not an archive", "junk")


def test_a_bad_manifest_in_an_archive_names_its_file_and_field_and_writes_nothing(demo, settings):
    files = _entries(portable.export_archive(demo))
    files["rules/conduct.toml"] = b'rules = ["ok", 7]\n'
    data = _tar([_file(name, body) for name, body in files.items() if name != "workspace"]
                + [(_dir("workspace"), None)])
    before = (Space.objects.count(), Member.objects.count(), Rule.objects.count())
    with pytest.raises(VeronicaError) as err:
        portable.create_from_archive(data, "broken")
    assert err.value.message.startswith("rules/conduct.toml: rules[1]:")
    assert (Space.objects.count(), Member.objects.count(), Rule.objects.count()) == before
    assert not (settings.DATA_DIR / "spaces" / "broken").exists()


def _dir(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    return info


def test_a_taken_slug_is_refused(demo):
    with pytest.raises(VeronicaError, match="exists already"):
        portable.create_from_template("demo-team", "demo")
    with pytest.raises(VeronicaError, match="no template 'nope'"):
        portable.create_from_template("nope", "fresh")


def test_the_creator_becomes_owner_and_may_create_needs_staff_or_the_permission(db, settings, tmp_path):
    from django.contrib.auth.models import Permission

    settings.DATA_DIR = tmp_path / "data"
    user = get_user_model().objects.create_user("maker")
    assert not portable.may_create(user)
    user.user_permissions.add(Permission.objects.get(codename="add_space", content_type__app_label="veronica"))
    user = get_user_model().objects.get(pk=user.pk)
    assert portable.may_create(user)
    space = portable.create_from_template("demo-team", "mine", user=user)
    assert SpaceAccess.objects.get(space=space, user=user).role == "owner"
    assert space.workdir.startswith(str(settings.DATA_DIR))


def test_an_archive_that_unpacks_past_the_limit_is_refused_at_that_entry(demo, monkeypatch):
    monkeypatch.setattr(portable, "MAX_UNPACKED_BYTES", 30)
    data = _tar([_file("space.toml", b"name = 'x'\n"), _file("members/big.md", b"y" * 40)])
    with pytest.raises(VeronicaError, match="'members/big.md': the archive unpacks to more than 30 bytes"):
        portable.create_from_archive(data, "bomb")
    assert not Space.objects.filter(slug="bomb").exists()


def test_a_skill_whose_body_opens_with_a_rule_line_round_trips(demo):
    from veronica.swarm import skills

    skills.add_skill(demo, "dashes", "---\nnot front matter\n---\nbody")
    first = portable.export_archive(demo)
    copy = portable.create_from_archive(first, "dashes-copy")
    assert Skill.objects.get(space=copy, name="dashes").body == "---\nnot front matter\n---\nbody"
    assert portable.export_archive(copy) == first


def test_awkward_text_round_trips_byte_for_byte(demo):
    from veronica.swarm import skills

    Member.objects.filter(space=demo, name="scout").update(
        persona='  Say "hi" \\ then — 🐝 \t\n\n', when_to_use="for probes\n", budget_override=-1)
    skills.add_skill(demo, "quoted", 'Body with """ and \\u0000-looking text', description="two\nlines")
    learning.add_user_rule("conduct", 'Quote "exactly"; tabs\tand\nnewlines 🐝', actor="op", owner=owner_key(demo))
    Space.objects.filter(pk=demo.pk).update(name='The "quoted" team ', daily_usd_ceiling="12.5")
    first = portable.export_archive(demo)
    copy = portable.create_from_archive(first, "awkward")
    assert portable.export_archive(copy) == first
    assert supervisor.get_member(copy, "scout").budget_override == -1
    assert float(Space.objects.get(pk=copy.pk).daily_usd_ceiling) == 12.5


# --- what main added since: verify checks, notifier, MCP servers, ops settings -------------------------------

@pytest.fixture
def ops_demo(demo):
    from veronica.swarm import mcp_servers
    from veronica.ops import notify
    from veronica.engine import checks, retention, watchdogs

    checks.configure(demo, [{"name": "tests", "command": "pytest -q", "timeout": 120},
                            {"name": "lint", "command": "ruff check 'src dir'", "timeout": 30}], actor="op")
    notify.configure(demo, webhook_url="https://ops:hunter2@alerts.example.com/hook?token=abc", actor="op",
                     slack_url="https://hooks.slack.com/services/T0/B0/sekrit", emails="a@example.com, b@example.com")
    retention.set_retention_days(demo, 14, actor="op")
    watchdogs.set_thresholds(demo, {"stuck_run_minutes": 45, "mailbox_backlog_minutes": 90}, actor="op")
    Space.objects.filter(pk=demo.pk).update(daily_token_ceiling=900000, daily_usd_ceiling="3.25", rule_review_required=False)
    mcp_servers.add(demo, mcp_servers.check({"name": "files", "command": ["python", "-m", "files_server", "--root", "."],
                                             "env": {"API_KEY": "sk-live-123", "MODE": "ro"}, "timeout": 20}), actor="op")
    mcp_servers.add(demo, mcp_servers.check({"name": "web", "url": "https://u:pw@mcp.example.com/mcp?key=zzz"}),
                    member=supervisor.get_member(demo, "scout"), actor="op")
    return Space.objects.get(pk=demo.pk)


def test_export_carries_checks_notifier_mcp_and_ops_settings_with_secrets_scrubbed(ops_demo):
    import tomllib

    data = portable.export_archive(ops_demo)
    files = _entries(data)
    space = tomllib.loads(files["space.toml"].decode())
    assert space["verify_checks"] == [{"name": "tests", "command": "pytest -q", "timeout": 120},
                                      {"name": "lint", "command": "ruff check 'src dir'", "timeout": 30}]
    assert space["notify"] == {"webhook_url": "https://alerts.example.com/hook", "email": ["a@example.com", "b@example.com"]}
    settings = space["settings"]
    assert (settings["retention_days"], settings["stuck_run_minutes"], settings["mailbox_backlog_minutes"]) == (14, 45, 90)
    assert (settings["daily_token_ceiling"], settings["daily_usd_ceiling"], settings["rule_review_required"]) == (900000, 3.25, False)
    assert space["mcp_servers"] == [{"name": "files", "command": ["python", "-m", "files_server", "--root", "."],
                                     "env": {"API_KEY": "", "MODE": ""}, "timeout": 20}]
    scout = tomllib.loads(files["members/scout/member.toml"].decode())
    assert scout["mcp_servers"] == [{"name": "web", "url": "https://mcp.example.com/mcp", "timeout": 30}]
    for secret in (b"hunter2", b"token=abc", b"sekrit", b"hooks.slack.com", b"sk-live-123", b"pw@", b"key=zzz", b"s3cret-hook"):
        assert secret not in gzip.decompress(data), secret


def test_round_trip_with_checks_notifier_mcp_and_ops_settings_is_byte_identical(ops_demo):
    from veronica.models import McpServer

    first = portable.export_archive(ops_demo)
    copy = portable.create_from_archive(first, "ops-copy")
    assert portable.export_archive(copy) == first
    copy = Space.objects.get(pk=copy.pk)
    assert [c["name"] for c in copy.verify_checks] == ["tests", "lint"]
    assert (copy.retention_days, copy.stuck_run_minutes, copy.mailbox_backlog_minutes) == (14, 45, 90)
    assert copy.notify_emails == "a@example.com, b@example.com" and copy.notify_slack_url == ""
    files = McpServer.objects.get(space=copy, member__isnull=True)
    assert (files.name, files.command, files.env, files.timeout) == ("files", ["python", "-m", "files_server", "--root", "."],
                                                                     {"API_KEY": "", "MODE": ""}, 20)
    assert McpServer.objects.get(member__space=copy, member__name="scout").url == "https://mcp.example.com/mcp"


def test_the_toml_writer_reads_back_exactly_what_it_wrote():
    import tomllib

    from veronica.portable import toml_out

    awkward = ['plain', 'q"uote', "back\\slash", "new\nline\ttab\r\f\b", "\x01\x1f\x7f", "🐝 — ü", "'single'", '"""', ""]
    data = {"s": awkward[1], "n": -7, "f": 0.1, "z": 0.0, "big": 1e-05, "b": True, "list": awkward, "odd key": "x",
            "table": {"a": 1, "b.c": "d"}, "arr": [{"name": "x", "env": {"K": "v\"", "L M": ""}}, {"name": "y", "n": [1, 2]}]}
    assert tomllib.loads(toml_out.dumps(data)) == data
    with pytest.raises(ValueError):
        toml_out.dumps({"x": float("inf")})


# --- hostile archives ---------------------------------------------------------------------------------------

def _counts():
    return (Space.objects.count(), Member.objects.count(), Skill.objects.count(), Rule.objects.count())


def test_a_gzip_bomb_is_refused_at_its_entry_by_the_real_limit_and_writes_nothing(demo, settings):
    zeros = b"\0" * (portable.MAX_UNPACKED_BYTES + 1)
    data = _tar([_file("space.toml", b"name = 'x'\n"), _file("workspace/zeros.bin", zeros)])
    assert len(data) < portable.MAX_ARCHIVE_BYTES // 50  # small upload, huge inside
    before = _counts()
    with pytest.raises(VeronicaError, match="'workspace/zeros.bin': the archive unpacks to more than"):
        portable.create_from_archive(data, "bomb")
    assert _counts() == before and not (settings.DATA_DIR / "spaces" / "bomb").exists()


def test_a_zip_file_even_a_bomb_is_not_a_tar_and_too_many_entries_are_refused(demo):
    import zipfile

    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("space.toml", b"\0" * 10_000_000)
    with pytest.raises(VeronicaError, match="not a readable tar"):
        portable.create_from_archive(raw.getvalue(), "zipped")
    many = _tar([_file(f"skills/s{i}.md", b"x") for i in range(portable.MAX_ENTRIES + 1)])
    with pytest.raises(VeronicaError, match=f"more than {portable.MAX_ENTRIES} entries"):
        portable.create_from_archive(many, "many")


def test_device_and_fifo_entries_are_refused(demo):
    for kind in (tarfile.CHRTYPE, tarfile.FIFOTYPE):
        info = tarfile.TarInfo("members/dev")
        info.type = kind
        with pytest.raises(VeronicaError, match="'members/dev': only plain files"):
            portable.create_from_archive(_tar([(info, None)]), "dev")


@pytest.mark.parametrize("name,body,prefix", [
    ("members/lead/member.toml", b"role = 'leader\n", "members/lead/member.toml: syntax:"),
    ("space.toml", b"name = 'x'\n[settings]\nspawn_cap = 'many'\n", "space.toml: settings.spawn_cap:"),
    ("space.toml", b"name = 'x'\n[[verify_checks]]\nname = 'a b'\ncommand = 'true'\n", "space.toml: verify_checks:"),
    ("members/scout/member.toml", b"[[mcp_servers]]\nname = 'web'\nurl = 'ftp://x'\n", "members/scout/member.toml: mcp_servers.web.url:"),
])
def test_bad_toml_in_an_archive_names_the_file_and_field_and_writes_nothing(demo, settings, name, body, prefix):
    files = _entries(portable.export_archive(demo))
    files[name] = body
    data = _tar([_file(n, b) for n, b in files.items() if n != "workspace"] + [(_dir("workspace"), None)])
    before = _counts()
    with pytest.raises(VeronicaError) as err:
        portable.create_from_archive(data, "broken")
    assert err.value.message.startswith(prefix), err.value.message
    assert _counts() == before and not (settings.DATA_DIR / "spaces" / "broken").exists()


def test_an_import_racing_for_a_slug_never_merges_into_the_space_that_won(demo, monkeypatch, tmp_path):
    data = portable.export_archive(demo)
    monkeypatch.setattr(portable, "check_slug", lambda slug: slug)  # as if the other request committed after our check
    monkeypatch.setattr(portable, "home_of", lambda slug: tmp_path / "race" / slug)
    before = (Member.objects.filter(space=demo).count(), Skill.objects.filter(space=demo).count())
    with pytest.raises(VeronicaError, match="exists already"):
        portable.create_from_archive(data, "demo")
    assert (Member.objects.filter(space=demo).count(), Skill.objects.filter(space=demo).count()) == before
    assert Space.objects.get(pk=demo.pk).manifest_path != str(tmp_path / "race" / "demo")
    assert not (tmp_path / "race" / "demo").exists()


def test_export_costs_the_same_queries_however_many_members(demo):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def queries() -> int:
        with CaptureQueriesContext(connection) as ctx:
            portable.export_archive(demo)
        return len(ctx.captured_queries)

    few = queries()
    for i in range(6):
        member = supervisor.add_member(demo, f"extra{i}", actor="test")
        Skill.objects.create(space=demo, member=member, name="own", body="a skill")
    assert queries() == few
