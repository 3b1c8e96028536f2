"""Per-member tool sets (the seed's active and deferred tools): what the model is offered is the
member's own set, declared in member.toml, the console or the API, and carried by export/import."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from tests.engine.test_live_vendor import openai_mock  # noqa: F401 (a fixture)
from tests.vendors import faults as f
from veronica.swarm import bus
from veronica.portable import archive as portable
from veronica.engine import runner, supervisor
from veronica.plumbing.errors import VeronicaError
from veronica.portable.manifest import register
from veronica.models import Member


def offered(body: dict) -> list[str]:
    return sorted(t["function"]["name"] for t in body.get("tools") or [])


def on_openai(space, **changes) -> Member:
    w1 = supervisor.get_member(space, "w1")
    return supervisor.edit_member(w1, {"model": "openai:gpt-4.1-mini", **changes}, actor="op")


def test_a_member_offered_two_tools_sees_only_those_in_its_request(space, openai_mock):
    w1 = on_openai(space, tools=["read_file", "send_message"])
    openai_mock.push(f.text("nothing to do"))
    bus.send(space, "boss", "w1", "hello")
    assert runner.wake(w1.pk, "message") == "done"
    assert offered(openai_mock.model_requests()[0].body) == ["read_file", "send_message"]


def test_without_a_tool_set_a_member_is_offered_every_tool_of_its_role(space, openai_mock):
    w1 = on_openai(space)
    openai_mock.push(f.text("ok"))
    bus.send(space, "boss", "w1", "hello")
    runner.wake(w1.pk, "message")
    names = offered(openai_mock.model_requests()[0].body)
    assert {"read_file", "send_message", "task_done", "write_file"} <= set(names) and "member_spawn" not in names


def test_a_deferred_tool_is_named_in_the_prompt_and_loaded_on_first_use(space, openai_mock):
    Path(space.workdir, "a.txt").write_text("x")
    w1 = on_openai(space, tools=["send_message"], deferred_tools=["list_dir"])
    openai_mock.push(f.tool_call("list_dir", {"path": "."}), f.text("listed"))
    bus.send(space, "boss", "w1", "what is there?")
    assert runner.wake(w1.pk, "message") == "done"
    first, second = (r.body for r in openai_mock.model_requests()[:2])
    assert offered(first) == ["send_message"]
    system = first["messages"][0]["content"]
    assert "# Deferred tools" in system and "- list_dir(" in system
    assert offered(second) == ["list_dir", "send_message"]  # its schema goes with every later call
    assert "a.txt" in str(second["messages"])  # and the call itself ran


def test_a_tool_outside_the_set_is_not_run(space, openai_mock):
    w1 = on_openai(space, tools=["send_message"])
    openai_mock.push(f.tool_call("write_file", {"path": "x.txt", "content": "no"}), f.text("ok"))
    bus.send(space, "boss", "w1", "write it")
    runner.wake(w1.pk, "message")
    second = openai_mock.model_requests()[1].body
    assert "unknown tool 'write_file'" in str(second["messages"])
    assert not Path(space.workdir, "x.txt").exists()


@pytest.mark.parametrize("changes, field, fragment", [
    ({"tools": ["nope"]}, "tools", "unknown tool 'nope'"),
    ({"tools": ["member_spawn"]}, "tools", "leader-only"),
    ({"tools": "read_file"}, "tools", "list"),
    ({"tools": ["read_file"], "deferred_tools": ["read_file"]}, "deferred_tools", "either active or deferred"),
    ({"deferred_tools": ["x" * 70]}, "deferred_tools", "unknown tool"),
])
def test_a_bad_tool_set_is_refused_naming_the_field_and_nothing_changes(space, changes, field, fragment):
    w1 = supervisor.get_member(space, "w1")
    with pytest.raises(VeronicaError) as err:
        supervisor.edit_member(w1, changes, actor="op")
    assert err.value.field == field and fragment in err.value.message
    w1.refresh_from_db()
    assert w1.tools is None and w1.deferred_tools == [] and w1.runtime_fields == []


@pytest.fixture
def manifest(tmp_path, demo_manifest):
    dest = tmp_path / "team"
    shutil.copytree(demo_manifest, dest)
    return dest


def test_member_toml_declares_the_tool_set_and_export_import_carries_it(db, manifest, settings, tmp_path):
    settings.DATA_DIR = tmp_path / "data"
    toml = manifest / "members/scout/member.toml"
    toml.write_text(toml.read_text() + 'tools = ["read_file", "mcp__docs__*"]\ndeferred_tools = ["grep"]\n')
    space = register(manifest)
    scout = supervisor.get_member(space, "scout")
    assert scout.tools == ["read_file", "mcp__docs__*"] and scout.deferred_tools == ["grep"]
    copy = portable.create_from_archive(portable.export_archive(space), "demo-copy")
    scout2 = supervisor.get_member(copy, "scout")
    assert scout2.tools == ["read_file", "mcp__docs__*"] and scout2.deferred_tools == ["grep"]
    assert supervisor.get_member(copy, "lead").tools is None  # no key: every tool of its role


@pytest.mark.parametrize("line, needle", [
    ('tools = ["teleport"]\n', "member.toml: tools: tools: unknown tool 'teleport'"),
    ('tools = "read_file"\n', "member.toml: tools: tools must be a list"),
    ('deferred_tools = ["task_create", 3]\n', "member.toml: deferred_tools: deferred_tools must be a list"),
    ('tools = ["skill_publish"]\n', "leader-only"),
])
def test_a_bad_tool_set_in_member_toml_names_file_and_field(db, manifest, line, needle):
    toml = manifest / "members/scout/member.toml"
    toml.write_text(toml.read_text() + line)
    with pytest.raises(CommandError) as err:
        call_command("register", str(manifest))
    assert needle in str(err.value)


def test_an_mcp_servers_tools_are_offered_by_name_or_by_server(space, settings):
    from tests.engine.test_mcp import declare
    from veronica.agent.mcp_client import manager
    from veronica.agent.tools import tools_for

    settings.COMMAND_SANDBOX = "none"  # the SDK test server needs the suite's virtualenv (see test_mcp)
    try:
        declare(space, "calc")
        w1 = supervisor.edit_member(supervisor.get_member(space, "w1"), {"tools": ["read_file", "mcp__calc__add"]}, actor="op")
        assert sorted(tools_for(w1)) == ["mcp__calc__add", "read_file"]
        w1 = supervisor.edit_member(w1, {"tools": ["read_file"], "deferred_tools": ["mcp__calc__*"]}, actor="op")
        offered_now = tools_for(w1)
        assert {"mcp__calc__add", "mcp__calc__note", "read_file"} <= set(offered_now) and "write_file" not in offered_now
        from veronica.agent.prompt import system_prompt

        assert "- mcp__calc__add(a, b): " in system_prompt(w1, offered_now)
    finally:
        manager().close_all()
