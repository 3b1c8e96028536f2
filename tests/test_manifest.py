import shutil

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from veronica.engine import supervisor
from veronica.portable.manifest import register
from veronica.models import Member, Space


@pytest.fixture
def manifest(tmp_path, demo_manifest):
    dest = tmp_path / "team"
    shutil.copytree(demo_manifest, dest)
    return dest


def test_register_creates_the_space_with_members_and_skills(db, manifest):
    call_command("register", str(manifest))
    space = Space.objects.get(slug="demo")
    assert sorted(space.members.values_list("name", flat=True)) == ["analyst", "lead", "scout"]
    lead = space.members.get(name="lead")
    assert lead.role == "leader" and lead.skills.filter(name="planning").exists()
    assert space.skills.filter(member__isnull=True, name="reporting").exists()
    assert space.blackboard_cap == 6000


def test_fresh_register_discards_runtime_overrides(db, manifest):
    space = register(manifest)
    scout = supervisor.get_member(space, "scout")
    supervisor.set_schedule(scout, "*/5 * * * *", actor="lead")
    supervisor.set_permission_mode(scout, "default", actor="op")
    clone = supervisor.spawn(scout, actor="lead")
    register(manifest, fresh=True)
    scout.refresh_from_db()
    clone.refresh_from_db()
    assert scout.schedule == "" and scout.schedule_origin == "manifest" and scout.permission_mode == "bypass"
    assert clone.removed_at is not None


@pytest.mark.parametrize("path,content,needle", [
    ("members/scout/member.toml", 'role = "king"\n', "member.toml: role"),
    ("members/scout/member.toml", 'schedule = "whenever"\n', "member.toml: schedule"),
    ("members/scout/member.toml", 'colour = "blue"\n', "member.toml: colour"),
    ("members/scout/member.toml", 'model = "gpt"\n', "member.toml: model"),
    ("members/analyst/member.toml", 'role = "leader"\n', "exactly one leader"),
    ("space.toml", 'name = ""\n', "space.toml: name"),
    ("space.toml", 'name = "x"\n[settings]\nblackboard_cap = "big"\n', "settings.blackboard_cap"),
])
def test_bad_manifest_names_file_and_field_and_changes_nothing(db, manifest, path, content, needle):
    space = register(manifest)
    before = list(Member.objects.values_list("name", "role", "schedule", "removed_at"))
    (manifest / path).write_text(content)
    with pytest.raises(CommandError) as err:
        call_command("register", str(manifest))
    assert needle in str(err.value)
    assert list(Member.objects.values_list("name", "role", "schedule", "removed_at")) == before
    assert Space.objects.get(pk=space.pk).name == "Demo team"


def test_missing_persona_is_named(db, manifest):
    (manifest / "members/scout/persona.md").unlink()
    with pytest.raises(CommandError, match="persona.md"):
        call_command("register", str(manifest))
    assert not Space.objects.exists()
