"""`register` is a restart by default (operator changes kept); `register --fresh` takes the manifest
as written. The command says which it did."""
import io
import shutil

import pytest
from django.core.management import call_command

from veronica.swarm import skills
from veronica.engine import supervisor
from veronica.models import Member, Role, Space


@pytest.fixture
def manifest(tmp_path, demo_manifest):
    dest = tmp_path / "team"
    shutil.copytree(demo_manifest, dest)
    return dest


def register(manifest, *flags) -> str:
    out = io.StringIO()
    call_command("register", str(manifest), *flags, stdout=out)
    return out.getvalue()



def names(space) -> list[str]:
    return sorted(Member.objects.filter(space=space, removed_at__isnull=True).values_list("name", flat=True))


@pytest.fixture
def changed(db, manifest):
    """A registered demo space after an operator's and the leader's runtime changes."""
    assert "(new space: the manifest as written)" in register(manifest)
    space = Space.objects.get(slug="demo")
    supervisor.add_member(space, "helper", role=Role.WORKER, actor="op")  # an operator adds one
    supervisor.remove_member(supervisor.get_member(space, "scout"), actor="op")  # and removes one
    analyst = supervisor.get_member(space, "analyst")
    supervisor.set_schedule(analyst, "*/5 * * * *", actor="lead")
    supervisor.set_permission_mode(analyst, "default", actor="op")
    supervisor.spawn(analyst, actor="lead")
    skills.add_skill(space, "runbook", "# Runbook\nStep one.", actor="lead")
    return space


def test_a_restart_register_keeps_operator_changes_and_applies_the_manifest(changed, manifest):
    (manifest / "members/analyst/persona.md").write_text("You analyse, version two.")
    text = register(manifest)
    assert "(restart register: manifest applied, operator and leader changes kept)" in text
    for line in ("kept: member helper (added at runtime)", "kept: member scout removed at runtime", "kept: clone analyst-1",
                 "kept: analyst: schedule '*/5 * * * *'", "kept: analyst: permission mode default",
                 "kept: shared skill runbook (published at runtime)", "run with --fresh"):
        assert line in text, text
    assert names(changed) == ["analyst", "analyst-1", "helper", "lead"]
    analyst = supervisor.get_member(changed, "analyst")
    assert analyst.persona == "You analyse, version two."  # the manifest's own fields still apply
    assert (analyst.schedule, analyst.schedule_origin, analyst.permission_mode) == ("*/5 * * * *", "runtime", "default")
    assert analyst.schedule_next_at is not None
    assert changed.skills.filter(member__isnull=True, name="runbook").exists()
    assert changed.skills.filter(member__isnull=True, name="reporting").exists()


def test_a_restart_keeps_a_cleared_schedule_and_revives_nothing_twice(changed, manifest):
    supervisor.clear_schedule(supervisor.get_member(changed, "lead"), actor="op")
    register(manifest)
    register(manifest)
    lead = supervisor.get_member(changed, "lead")
    assert lead.schedule_tombstone and lead.schedule == ""
    assert Member.objects.filter(space=changed, name="scout").count() == 1  # never re-created


def test_a_fresh_register_discards_runtime_overrides(changed, manifest):
    text = register(manifest, "--fresh")
    assert "(fresh register: the manifest as written, runtime overrides discarded)" in text
    for line in ("discarded: member helper (added at runtime)", "discarded: clone analyst-1",
                 "discarded: analyst: schedule '*/5 * * * *'", "discarded: analyst: permission mode default",
                 "discarded: shared skill runbook (not in the manifest)"):
        assert line in text, text
    assert names(changed) == ["analyst", "lead", "scout"]
    analyst = supervisor.get_member(changed, "analyst")
    assert (analyst.schedule_origin, analyst.permission_mode) == ("manifest", "bypass")
    assert not changed.skills.filter(name="runbook").exists()


def test_a_member_dropped_from_the_manifest_leaves_on_restart_and_comes_back_when_re_added(db, manifest):
    register(manifest)
    space = Space.objects.get(slug="demo")
    shutil.move(str(manifest / "members/scout"), str(manifest.parent / "scout"))
    register(manifest)
    assert names(space) == ["analyst", "lead"]
    shutil.move(str(manifest.parent / "scout"), str(manifest / "members/scout"))
    register(manifest)
    assert names(space) == ["analyst", "lead", "scout"]
