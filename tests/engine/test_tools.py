import os

import pytest

from veronica.agent.tools import ToolContext, tools_for
from veronica.agent.tools import workspace as ws
from veronica.agent.tools.base import ToolError
from veronica.engine import supervisor


@pytest.fixture
def ctx(space, tmp_path):
    root = tmp_path / "alpha"
    (root / "src").mkdir()
    (root / "src" / "a.py").write_text("x = 1  # TODO fix\n")
    (tmp_path / "secret.txt").write_text("top secret TODO\n")
    return ToolContext(member=supervisor.get_member(space, "w1"), space=space)


@pytest.mark.parametrize("path", ["../secret.txt", "/etc/passwd", "src/../../secret.txt"])
def test_paths_outside_the_workspace_are_refused(ctx, path):
    with pytest.raises(ToolError, match="outside the workspace"):
        ws.read_file(ctx, {"path": path})


def test_a_symlink_out_of_the_workspace_is_refused(ctx, tmp_path):
    os.symlink(tmp_path / "secret.txt", tmp_path / "alpha" / "link.txt")
    with pytest.raises(ToolError, match="outside the workspace"):
        ws.read_file(ctx, {"path": "link.txt"})
    assert "top secret" not in ws.grep(ctx, {"pattern": "TODO"})
    with pytest.raises(ToolError, match="outside the workspace"):
        ws.write_file(ctx, {"path": "link.txt", "content": "pwned"})
    assert (tmp_path / "secret.txt").read_text() == "top secret TODO\n"


def test_read_tools_work_inside(ctx):
    assert "src/" in ws.list_dir(ctx, {})
    assert "1  x = 1" in ws.read_file(ctx, {"path": "src/a.py"})
    assert ws.grep(ctx, {"pattern": "TODO"}) == "src/a.py:1: x = 1  # TODO fix"
    assert ws.glob_files(ctx, {"pattern": "**/*.py"}) == "src/a.py"
    with pytest.raises(ToolError, match="not a valid regular expression"):
        ws.grep(ctx, {"pattern": "("})


def test_edit_file_needs_exactly_one_match(ctx):
    with pytest.raises(ToolError, match="occurs 0 times"):
        ws.edit_file(ctx, {"path": "src/a.py", "old": "y", "new": "z"})
    ws.edit_file(ctx, {"path": "src/a.py", "old": "x = 1", "new": "x = 2"})
    assert "x = 2" in ws.read_file(ctx, {"path": "src/a.py"})


def test_run_command_runs_in_the_workspace_with_timeout_and_cap(ctx, tmp_path):
    assert ws.run_command(ctx, {"command": "pwd"}).splitlines()[1] == "/workspace"
    assert "x = 1" in ws.run_command(ctx, {"command": "cat src/a.py"})
    with pytest.raises(ToolError, match="timed out after 1s"):
        ws.run_command(ctx, {"command": "sleep 5", "timeout": 1})
    out = ws.run_command(ctx, {"command": "yes | head -c 50000"})
    assert "truncated" in out and len(out) < ws.COMMAND_OUTPUT_CAP + 100
    with pytest.raises(ToolError, match="between 1 and 30"):
        ws.run_command(ctx, {"command": "true", "timeout": 999})


def test_run_command_cannot_see_outside_the_workspace(ctx, tmp_path):
    out = ws.run_command(ctx, {"command": f"cat {tmp_path}/secret.txt; cat ../secret.txt; ls /root; cat /etc/passwd"})
    assert "top secret" not in out and "root:x:" not in out
    ws.run_command(ctx, {"command": "echo made > inside.txt"})
    assert (tmp_path / "alpha" / "inside.txt").read_text() == "made\n"


def test_run_command_refuses_without_a_sandbox(ctx, monkeypatch):
    from veronica.agent.tools import sandbox

    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    with pytest.raises(ToolError, match="needs bubblewrap"):
        ws.run_command(ctx, {"command": "true"})


def test_every_tool_declares_whether_it_mutates():
    tools = tools_for("leader")
    readonly = {n for n, t in tools.items() if not t.mutates}
    assert {"list_dir", "read_file", "grep", "glob", "task_list", "list_members", "blackboard_read"} <= readonly
    assert {"write_file", "edit_file", "run_command", "send_message", "task_create", "blackboard_write"}.isdisjoint(readonly)
    assert tools["write_file"].needs_approval and not tools["send_message"].needs_approval
    assert "member_spawn" not in tools_for("worker")


def test_swarm_tools_give_readable_errors(ctx):
    from veronica.agent.loop import run_tool

    tools = tools_for("worker")
    assert "ambiguous" in run_tool(tools["send_message"], ctx, {"to": "worker", "body": "hi"})
    assert "no task #99" in run_tool(tools["task_done"], ctx, {"task_id": 99})
    assert "cap is" in run_tool(tools["blackboard_write"], ctx, {"content": "x" * 10000})
    assert run_tool(tools["send_message"], ctx, {"to": "boss", "body": "hi"}) == "sent to boss"


@pytest.mark.django_db
def test_waggle_run_replays_through_the_runs_own_tool_table(ctx):
    """waggle_run replays a route through the table the run listed at its boundary (ToolContext.tools), not a
    table of its own: the stand-ins below are the only list_dir and grep it can reach. Without a run's table
    it says so instead of listing the member's tools again."""
    from veronica.agent.tools.base import Tool
    from waggle.models import Waggle
    from waggle.route import Route, Step, render_script

    route = Route(steps=(Step("list_dir", binds=(("path", "path"),)), Step("grep", literals=(("pattern", "TODO"),),
                                                                            binds=(("path", "path"),))), params=("path",))
    route = Route(steps=route.steps, params=route.params, name=route.stable_name(), scope="space")
    Waggle.objects.create(name=route.name, scope="space", space_key=str(ctx.space.pk), route=route.to_json(),
                          script=render_script(route), length=2)
    seen = []
    table = {name: Tool(name, "a stand-in", lambda c, args, name=name: seen.append((name, args)) or f"{name} ran")
             for name in ("list_dir", "grep")}
    waggle_run = tools_for("worker")["waggle_run"]
    args = {"name": route.name, "params": {"path": "src"}}
    ctx.tools = table
    out = waggle_run.fn(ctx, args)
    assert seen == [("list_dir", {"path": "src"}), ("grep", {"pattern": "TODO", "path": "src"})]
    assert "list_dir ran" in out and "grep ran" in out
    ctx.tools = None
    with pytest.raises(ToolError, match="no run"):
        waggle_run.fn(ctx, args)
