"""Bad input below HTTP: cron, the verbs, the model's tools and manifests.

A refused input raises VeronicaError naming the field (tools: an `error:` text the model can read,
never "failed unexpectedly"; manifests: a ManifestError naming the file, the field and the limit),
and the stored state is exactly what it was. Runs unchanged on SQLite and PostgreSQL.
"""
from __future__ import annotations

import shutil
from datetime import datetime, timezone

import pytest

from tests.bad_input import NUL, SURROGATE, changed_tables, db_state
from veronica.swarm import blackboard, bus, ledger, skills
from veronica.agent.loop import run_tool
from veronica.agent.tools import ToolContext, tools_for
from veronica.engine import supervisor
from veronica.plumbing.errors import VeronicaError
from veronica.portable.manifest import ManifestError, register

# --- cron ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("expr, normalized", [
    ("*/15 * * * *", "*/15 * * * *"), (" 0  9 * * 1-5 ", "0 9 * * 1-5"), ("0 0 29 2 *", "0 0 29 2 *"),
    ("30 6 * * mon", "30 6 * * mon"), ("0 0 L * *", "0 0 L * *"),
])
def test_cron_accepts_five_fields_that_fire(expr, normalized):
    assert supervisor.validate_cron(expr) == normalized


@pytest.mark.parametrize("expr, fragment", [
    ("0 0 30 2 *", "never fires"), ("0 0 31 4 *", "never fires"), ("0 0 31 2,4,6 *", "never fires"),
    ("* * * * * *", "has 6 fields"), ("0 0 1 1 * 2030", "has 6 fields"), ("0 0 1 1 * 2030 x", "has 7 fields"),
    ("* * * *", "has 4 fields"), ("@daily", "has 1 field;"), ("60 * * * *", "out of range"), ("*/0 * * * *", "step"),
    ("a b c d e", "not a valid cron"), ("", "must not be empty"), (f"* * * * *{NUL}", "NUL"), ("* " * 70, "limit is 120"),
])
def test_cron_refuses_with_a_message_that_matches_what_is_accepted(expr, fragment):
    with pytest.raises(VeronicaError) as err:
        supervisor.validate_cron(expr)
    assert fragment in err.value.message and err.value.field == "schedule"


def test_a_stored_schedule_that_can_never_fire_has_no_next_time():
    assert supervisor.next_fire("0 0 30 2 *") is None
    assert supervisor.next_fire("0 0 * * *", datetime(2026, 1, 1, 12, tzinfo=timezone.utc)) == datetime(2026, 1, 2, tzinfo=timezone.utc)


# --- verbs ----------------------------------------------------------------------------------------------------

def _verb_cases():
    def w1(space):
        return supervisor.get_member(space, "w1")

    return [
        ("add_member name NUL", lambda s: supervisor.add_member(s, f"w{NUL}9", actor="t"), "name"),
        ("add_member name surrogate", lambda s: supervisor.add_member(s, f"w9{SURROGATE}", actor="t"), "name"),
        ("add_member persona NUL", lambda s: supervisor.add_member(s, "w9", persona=NUL, actor="t"), "persona"),
        ("add_member when_to_use NUL", lambda s: supervisor.add_member(s, "w9", when_to_use=NUL, actor="t"), "when_to_use"),
        ("add_member when_to_use long", lambda s: supervisor.add_member(s, "w9", when_to_use="u" * 2001, actor="t"), "when_to_use"),
        ("add_member model long", lambda s: supervisor.add_member(s, "w9", model="anthropic:" + "m" * 120, actor="t"), "model"),
        ("add_member model type", lambda s: supervisor.add_member(s, "w9", model=None, actor="t"), "model"),
        ("add_member budget range", lambda s: supervisor.add_member(s, "w9", budget_override=2**40, actor="t"), "budget_override"),
        ("add_member budget bool", lambda s: supervisor.add_member(s, "w9", budget_override=True, actor="t"), "budget_override"),
        ("add_member domain NUL", lambda s: supervisor.add_member(s, "w9", rule_domains=[NUL], actor="t"), "rule_domains"),
        ("add_member domain type", lambda s: supervisor.add_member(s, "w9", rule_domains=[{"a": 1}], actor="t"), "rule_domains"),
        ("add_member domains many", lambda s: supervisor.add_member(s, "w9", rule_domains=["d"] * 21, actor="t"), "rule_domains"),
        ("add_member skill NUL", lambda s: supervisor.add_member(s, "w9", skills={"ok": f"b{NUL}"}, actor="t"), "body"),
        ("set_schedule never", lambda s: supervisor.set_schedule(w1(s), "0 0 30 2 *", actor="t"), "schedule"),
        ("set_schedule 6 fields", lambda s: supervisor.set_schedule(w1(s), "0 * * * * *", actor="t"), "schedule"),
        ("get_member NUL", lambda s: supervisor.get_member(s, f"w1{NUL}"), "member"),
        ("send body NUL", lambda s: bus.send(s, "boss", "w1", f"x{NUL}"), "body"),
        ("send to NUL", lambda s: bus.send(s, "boss", f"w1{NUL}", "x"), "to"),
        ("send subject surrogate", lambda s: bus.send(s, "boss", "w1", "x", subject=SURROGATE), "subject"),
        ("create_task title NUL", lambda s: ledger.create_task(s, "boss", f"t{NUL}"), "title"),
        ("create_task spec NUL", lambda s: ledger.create_task(s, "boss", "t", spec=NUL), "spec"),
        ("create_task title long", lambda s: ledger.create_task(s, "boss", "t" * 201), "title"),
        ("transition reason NUL", lambda s: ledger.transition(ledger.get_task(s, s.tasks.get().pk), "cancelled", actor="boss",
                                                              reason=NUL), "reason"),
        ("blackboard NUL", lambda s: blackboard.write(s, "boss", f"plan{NUL}"), "content"),
        ("blackboard surrogate", lambda s: blackboard.write(s, "boss", SURROGATE), "content"),
        ("add_skill name NUL", lambda s: skills.add_skill(s, f"n{NUL}", "b"), "name"),
        ("add_skill body NUL", lambda s: skills.add_skill(s, "n", f"b{NUL}"), "body"),
        ("add_skill description NUL", lambda s: skills.add_skill(s, "n", "b", description=NUL), "description"),
        ("remove_skill name NUL", lambda s: skills.remove_skill(s, f"n{NUL}"), "name"),
    ]


VERB_CASES = _verb_cases()


@pytest.mark.parametrize("label, call, field", VERB_CASES, ids=[c[0] for c in VERB_CASES])
def test_a_verb_refuses_bad_text_naming_the_field_and_writes_nothing(space, label, call, field):
    ledger.create_task(space, "boss", "an open task")
    before = db_state()
    with pytest.raises(VeronicaError) as err:
        call(space)
    assert err.value.field == field, err.value.as_dict()
    assert not changed_tables(before, db_state()), f"partial write: {changed_tables(before, db_state())}"


# --- the model's tools ------------------------------------------------------------------------------------------

TOOL_CASES = [
    ("send_message", {"to": "w1", "body": f"x{NUL}"}, "body"),
    ("send_message", {"to": f"w1{NUL}", "body": "x"}, "to"),
    ("send_message", {"to": "w1", "body": "x", "subject": NUL}, "subject"),
    ("task_create", {"title": f"t{NUL}"}, "title"),
    ("task_create", {"title": "t", "spec": SURROGATE}, "spec"),
    ("task_create", {"title": "t", "verify": NUL}, "verify"),
    ("task_create", {"title": "t", "assignee": f"w1{NUL}"}, "to"),
    ("task_list", {"status": NUL}, "status"),
    ("task_update_status", {"task_id": "{task}", "status": NUL}, "status"),
    ("task_update_status", {"task_id": "{task}", "status": "cancelled", "reason": f"r{NUL}"}, "reason"),
    ("task_done", {"task_id": "{task}", "result": f"r{NUL}"}, "result"),
    ("blackboard_write", {"content": f"c{NUL}"}, "content"),
    ("schedule_set", {"cron": "0 0 30 2 *"}, "never fires"),
    ("schedule_set", {"cron": "* * * * * *"}, "exactly five"),
    ("schedule_set", {"cron": f"* * * * *{NUL}"}, "schedule"),
    ("schedule_set", {"cron": "* * * * *", "member": NUL}, "to"),
    ("alarm_set", {"in_minutes": 5, "note": f"n{NUL}"}, "note"),
    ("skill_publish", {"name": f"n{NUL}", "body": "b"}, "name"),
    ("skill_publish", {"name": "n", "body": f"b{NUL}"}, "body"),
    ("skill_publish", {"name": "n", "body": "b", "description": SURROGATE}, "description"),
    ("skill_publish", {"name": "Bad Name", "body": "b"}, "name"),
    ("member_spawn", {"base": "w1", "retire": NUL}, "retire"),
    ("member_retire", {"member": NUL}, "to"),
    ("ask_operator", {"question": f"which{NUL}?"}, "question"),
    ("waggle_run", {"name": f"w{NUL}"}, "name"),
    ("waggle_run", {"name": "w", "params": {"path": NUL}}, "params.path"),
]


@pytest.mark.parametrize("tool, args, needle", TOOL_CASES)
def test_a_tool_answers_bad_text_with_an_error_the_model_can_read(space, tool, args, needle):
    boss = supervisor.get_member(space, "boss")
    task = ledger.create_task(space, "boss", "t", assignee=supervisor.get_member(space, "w1"))
    args = {k: task.pk if v == "{task}" else v for k, v in args.items()}
    before = db_state()
    result = run_tool(tools_for("leader")[tool], ToolContext(member=boss, space=space), args)
    assert result.startswith("error:") and "unexpectedly" not in result, result
    assert needle in result, result
    assert not changed_tables(before, db_state()), f"partial write: {changed_tables(before, db_state())}"


# --- manifests ----------------------------------------------------------------------------------------------------

SCOUT = "members/scout/member.toml"
SCOUT_BASE = 'role = "worker"\nmodel = "offline"\n'
SPACE_BASE = 'name = "Demo team"\nslug = "demo"\nworkdir = "workspace"\n'


def _text(path: str, text: str):
    return lambda root: (root / path).write_text(text)


def _bytes(path: str, data: bytes):
    return lambda root: (root / path).write_bytes(data)


def _member_folder(name: str):
    return lambda root: shutil.copytree(root / "members/scout", root / "members" / name)


def _skill(path: str, text: str = "a skill body\n"):
    return lambda root: (root / path).write_text(text)


# (label, how to break the manifest, the file the error must name, the field it must name)
MANIFEST_CASES = [
    ("space name too long", _text("space.toml", 'name = "' + "n" * 121 + '"\nslug = "demo"\n'), "space.toml", "name"),
    ("space name NUL", _text("space.toml", 'name = "a\\u0000b"\nslug = "demo"\n'), "space.toml", "name"),
    ("slug too long", _text("space.toml", 'name = "x"\nslug = "' + "s" * 61 + '"\n'), "space.toml", "slug"),
    ("slug not a slug", _text("space.toml", 'name = "x"\nslug = "Bad Slug"\n'), "space.toml", "slug"),
    ("slug empty from name", _text("space.toml", 'name = "!!!"\n'), "space.toml", "slug"),
    ("workdir not a string", _text("space.toml", 'name = "x"\nworkdir = 5\n'), "space.toml", "workdir"),
    ("space.toml not UTF-8", _bytes("space.toml", b'name = "caf\xe9"\n'), "space.toml", "file"),
    ("settings not a table", _text("space.toml", SPACE_BASE + "settings = 5\n"), "space.toml", "settings"),
    ("blackboard_cap zero", _text("space.toml", SPACE_BASE + "[settings]\nblackboard_cap = 0\n"), "space.toml",
     "settings.blackboard_cap"),
    ("blackboard_cap huge", _text("space.toml", SPACE_BASE + "[settings]\nblackboard_cap = 10000000000000\n"), "space.toml",
     "settings.blackboard_cap"),
    ("spawn_cap negative", _text("space.toml", SPACE_BASE + "[settings]\nspawn_cap = -1\n"), "space.toml", "settings.spawn_cap"),
    ("spawn_cap huge", _text("space.toml", SPACE_BASE + "[settings]\nspawn_cap = 100000\n"), "space.toml", "settings.spawn_cap"),
    ("daily tokens past int", _text("space.toml", SPACE_BASE + "[settings]\nmember_daily_tokens = 99999999999\n"), "space.toml",
     "settings.member_daily_tokens"),
    ("usd ceiling too big", _text("space.toml", SPACE_BASE + "[settings]\ndaily_usd_ceiling = 1e12\n"), "space.toml",
     "settings.daily_usd_ceiling"),
    ("usd ceiling negative", _text("space.toml", SPACE_BASE + "[settings]\ndaily_usd_ceiling = -1.5\n"), "space.toml",
     "settings.daily_usd_ceiling"),
    ("usd ceiling nan", _text("space.toml", SPACE_BASE + "[settings]\ndaily_usd_ceiling = nan\n"), "space.toml",
     "settings.daily_usd_ceiling"),
    ("bogus default mode", _text("space.toml", SPACE_BASE + '[settings]\ndefault_permission_mode = "yolo"\n'), "space.toml",
     "settings.default_permission_mode"),
    ("webhook secret long", _text("space.toml", SPACE_BASE + '[settings]\nwebhook_secret = "' + "s" * 201 + '"\n'), "space.toml",
     "settings.webhook_secret"),
    ("retention bool", _text("space.toml", SPACE_BASE + "[settings]\nretention_days = true\n"), "space.toml",
     "settings.retention_days"),
    ("review not bool", _text("space.toml", SPACE_BASE + '[settings]\nrule_review_required = "yes"\n'), "space.toml",
     "settings.rule_review_required"),
    ("bogus permission mode", _text(SCOUT, SCOUT_BASE + 'permission_mode = "yolo"\n'), "member.toml", "permission_mode"),
    ("model too long", _text(SCOUT, 'model = "openai:' + "m" * 200 + '"\n'), "member.toml", "model"),
    ("model not a string", _text(SCOUT, "model = 5\n"), "member.toml", "model"),
    ("cron never fires", _text(SCOUT, SCOUT_BASE + 'schedule = "0 0 30 2 *"\n'), "member.toml", "schedule"),
    ("cron six fields", _text(SCOUT, SCOUT_BASE + 'schedule = "* * * * * *"\n'), "member.toml", "schedule"),
    ("cron with a year", _text(SCOUT, SCOUT_BASE + 'schedule = "0 0 1 1 * 2030"\n'), "member.toml", "schedule"),
    ("cron not a string", _text(SCOUT, SCOUT_BASE + "schedule = 5\n"), "member.toml", "schedule"),
    ("budget past int", _text(SCOUT, SCOUT_BASE + "budget = 99999999999\n"), "member.toml", "budget"),
    ("budget bool", _text(SCOUT, SCOUT_BASE + "budget = true\n"), "member.toml", "budget"),
    ("iterations zero", _text(SCOUT, SCOUT_BASE + "max_iterations = 0\n"), "member.toml", "max_iterations"),
    ("iterations bool", _text(SCOUT, SCOUT_BASE + "max_iterations = true\n"), "member.toml", "max_iterations"),
    ("domain NUL", _text(SCOUT, SCOUT_BASE + 'rule_domains = ["a\\u0000"]\n'), "member.toml", "rule_domains[0]"),
    ("domain too long", _text(SCOUT, SCOUT_BASE + 'rule_domains = ["' + "d" * 65 + '"]\n'), "member.toml", "rule_domains"),
    ("domains not a list", _text(SCOUT, SCOUT_BASE + 'rule_domains = "conduct"\n'), "member.toml", "rule_domains"),
    ("when_to_use too long", _text(SCOUT, SCOUT_BASE + 'when_to_use = "' + "u" * 2001 + '"\n'), "member.toml", "when_to_use"),
    ("when_to_use not text", _text(SCOUT, SCOUT_BASE + "when_to_use = 5\n"), "member.toml", "when_to_use"),
    ("when_to_use NUL", _text(SCOUT, SCOUT_BASE + 'when_to_use = "\\u0000"\n'), "member.toml", "when_to_use"),
    ("member.toml not UTF-8", _bytes(SCOUT, b'when_to_use = "\xff"\n'), "member.toml", "file"),
    ("persona not UTF-8", _bytes("members/scout/persona.md", b"You are \xff\xfe a scout.\n"), "persona.md", "persona"),
    ("persona NUL", _bytes("members/scout/persona.md", b"You are\x00 a scout.\n"), "persona.md", "persona"),
    ("persona too long", _text("members/scout/persona.md", "p" * 50001), "persona.md", "persona"),
    ("member named operator", _member_folder("operator"), "members/operator", "name"),
    ("member named all", _member_folder("all"), "members/all", "name"),
    ("member named System", _member_folder("System"), "members/System", "name"),
    ("member named with markup", _member_folder("<b>x"), "members/<b>x", "name"),
    ("member name leading dash", _member_folder("-scout"), "members/-scout", "name"),
    ("member name too long", _member_folder("m" * 61), "members/" + "m" * 61, "name"),
    ("member name not UTF-8", lambda root: shutil.copytree(root / "members/scout", root.joinpath(b"members/sc\xffout".decode(
        "utf-8", "surrogateescape"))), "members/sc", "name"),
    ("shared skills differ by case", _skill("skills/Reporting.md"), "also the skill in Reporting.md", "name"),
    ("member skills differ by case", _skill("members/lead/skills/PLANNING.md"), "also the skill in PLANNING.md", "name"),
    ("skill name with a space", _skill("skills/bad name.md"), "bad name.md", "name"),
    ("skill not UTF-8", _bytes("skills/extra.md", b"body \xff\n"), "extra.md", "file"),
    ("skill description too long", _skill("skills/extra.md", "---\ndescription: " + "d" * 301 + "\n---\nbody\n"), "extra.md",
     "description"),
    ("skill body too long", _skill("skills/extra.md", "b" * 50001), "extra.md", "body"),
    ("skill body NUL", _bytes("skills/extra.md", b"body\x00\n"), "extra.md", "file"),
]


@pytest.fixture
def manifest(tmp_path, demo_manifest):
    dest = tmp_path / "team"
    shutil.copytree(demo_manifest, dest)
    return dest


@pytest.mark.parametrize("label, breaks, filename, field", MANIFEST_CASES, ids=[c[0] for c in MANIFEST_CASES])
def test_a_bad_manifest_names_file_and_field_and_writes_nothing(db, manifest, label, breaks, filename, field):
    register(manifest)
    breaks(manifest)
    before = db_state()
    with pytest.raises(ManifestError) as err:
        register(manifest)
    assert filename in err.value.message and f": {field}: " in err.value.message, err.value.message
    assert not changed_tables(before, db_state()), f"partial write: {changed_tables(before, db_state())}"


@pytest.mark.parametrize("label, breaks, filename, field", MANIFEST_CASES[:8] + MANIFEST_CASES[-14:],
                         ids=[c[0] for c in MANIFEST_CASES[:8] + MANIFEST_CASES[-14:]])
def test_a_bad_manifest_never_creates_the_space(db, manifest, label, breaks, filename, field):
    breaks(manifest)
    before = db_state()
    with pytest.raises(ManifestError):
        register(manifest)
    assert not changed_tables(before, db_state()), f"partial write: {changed_tables(before, db_state())}"


def test_manifest_limits_are_named(db, manifest):
    (manifest / SCOUT).write_text(SCOUT_BASE + "budget = 99999999999\n")
    with pytest.raises(ManifestError, match="2147483647"):
        register(manifest)
    (manifest / SCOUT).write_text(SCOUT_BASE)
    (manifest / "space.toml").write_text(SPACE_BASE + "[settings]\nspawn_cap = 1000\n")
    with pytest.raises(ManifestError, match="from 0 to 100"):
        register(manifest)
