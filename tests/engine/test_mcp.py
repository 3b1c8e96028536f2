"""MCP tools against a real MCP server written with the SDK (tests/mcp_server.py), over stdio and
streamable HTTP.

The stdio servers run with VERONICA_COMMAND_SANDBOX=none: bubblewrap mounts only /usr, so inside it
the suite's virtualenv (and the `mcp` package the test server imports) does not exist. That the
stdio command goes through run_command's sandbox wrapper is pinned separately (the argv)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from veronica.swarm import bus, mcp_servers
from veronica.agent import waggle_bridge
from veronica.agent.loop import run_tool
from veronica.agent.mcp_client import manager
from veronica.agent.tools import ToolContext, ToolError, tools_for
from veronica.agent.tools.mcp import NAME_LIMIT, spec_of, tool_name
from veronica.engine import approvals, runner, supervisor
from veronica.models import Approval, McpServer, Turn

SERVER = str(Path(__file__).resolve().parent.parent / "mcp_server.py")


@pytest.fixture(autouse=True)
def unsandboxed(settings):
    settings.COMMAND_SANDBOX = "none"
    settings.MCP_ALLOW_HOSTS = ["127.0.0.1"]  # the SDK test server listens on loopback
    yield
    manager().close_all()  # stop this test's server processes


def declare(space, name="calc", member=None, **cfg):
    cfg = cfg or {"command": [sys.executable, SERVER], "env": {"GREETING": "hello"}, "timeout": 20}
    return mcp_servers.add(space, mcp_servers.check({"name": name, **cfg}), member=member, actor="test")


def w1_of(space):
    return supervisor.get_member(space, "w1")


def ctx_of(member):
    return ToolContext(member=member, space=member.space)


def test_tool_names_are_prefixed_and_fit_the_vendors_limit():
    assert tool_name("calc", "add") == "mcp__calc__add"
    assert tool_name("calc", "a.b c") == "mcp__calc__a_b_c"
    long_a, long_b = tool_name("server", "x" * 80 + "a"), tool_name("server", "x" * 80 + "b")
    assert len(long_a) == NAME_LIMIT and long_a != long_b


def test_a_stdio_servers_tools_are_offered_prefixed_with_read_only_from_the_annotation(space):
    declare(space)
    tools = tools_for(w1_of(space))
    assert {"mcp__calc__add", "mcp__calc__note", "mcp__calc__whoami", "read_file"} <= set(tools)
    add, note = tools["mcp__calc__add"], tools["mcp__calc__note"]
    assert not add.mutates and not add.needs_approval
    assert note.mutates and note.needs_approval  # no readOnlyHint: gated like write_file
    assert add.spec()["parameters"]["required"] == ["a", "b"]
    ctx = ctx_of(w1_of(space))
    assert run_tool(add, ctx, {"a": 2, "b": 40}) == "42"
    assert "greeting=hello" in run_tool(tools["mcp__calc__whoami"], ctx, {})
    assert run_tool(tools["mcp__calc__fail"], ctx, {}).startswith("error: fail reported an error: Error executing tool fail: this tool always fails")
    row = McpServer.objects.get()
    assert row.last_error == "" and {"name": "add", "read_only": True} in row.tools_cached and row.checked_at


def test_a_member_sees_the_spaces_servers_and_its_own_only(space):
    declare(space, "shared")
    declare(space, "mine", member=w1_of(space))
    assert {"mcp__shared__add", "mcp__mine__add"} <= set(tools_for(w1_of(space)))
    w2_tools = tools_for(supervisor.get_member(space, "w2"))
    assert "mcp__shared__add" in w2_tools and "mcp__mine__add" not in w2_tools


def test_the_loop_calls_a_read_only_mcp_tool_and_gates_a_mutating_one(space, scripted, django_user_model):
    operator = django_user_model.objects.create_user("op")
    declare(space)
    w1 = supervisor.set_permission_mode(w1_of(space), "default", actor="op")
    scripted(("mcp__calc__add", {"a": 1, "b": 2}), ("mcp__calc__note", {"text": "remember"}), "done")
    bus.send(space, "boss", "w1", "add and note")
    assert runner.wake(w1.pk, "message") == "waiting"
    assert Turn.objects.filter(role="tool", tool_name="mcp__calc__add").get().content == "3"
    approval = Approval.objects.get()
    assert approval.tool_name == "mcp__calc__note"
    approvals.decide(approval, approve=True, user=operator)
    assert runner.wake(w1.pk, "resume") == "done"
    assert Turn.objects.filter(role="tool", tool_name="mcp__calc__note").get().content == "noted: remember"


def test_the_loop_calls_mcp_servers_outside_the_runs_transaction(space, scripted, monkeypatch):
    """An MCP call is network I/O that may take its whole timeout: it must not hold the run's
    transaction (and the member and space row locks its fence took) while it waits."""
    from django.db import connections

    from veronica.agent.mcp_client import Manager

    declare(space)
    run_connection = connections["default"]  # the run's (this thread's) connection
    baseline = len(run_connection.atomic_blocks)  # the test's own transaction(s)
    depth = []
    real = Manager.call

    def watched(self, *args, **kwargs):
        depth.append(len(run_connection.atomic_blocks))  # the run's transaction depth while the call waits
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Manager, "call", watched)
    scripted(("mcp__calc__add", {"a": 1, "b": 2}), "done")
    bus.send(space, "boss", "w1", "add")
    assert runner.wake(w1_of(space).pk, "message") == "done"
    assert depth == [baseline]
    assert Turn.objects.filter(role="tool", tool_name="mcp__calc__add").get().content == "3"


def test_waggle_may_replay_read_only_mcp_tools_only(space):
    declare(space)
    member = w1_of(space)
    step = waggle_bridge.make_exec(ctx_of(member), tools_for(member))
    assert step("mcp__calc__add", {"a": 5, "b": 5}) == "10"
    with pytest.raises(ToolError, match="read-only"):
        step("mcp__calc__note", {"text": "x"})


def test_an_mcp_tool_reaches_outside_the_space_unless_declared_closed_world(space):
    """Issue 24 point 4: MCP's default is open-world; a replay never steers such a tool with a value
    from an output (waggle's guard asks the host through reaches_out)."""
    declare(space)
    tools = tools_for(w1_of(space))
    assert tools["mcp__calc__add"].reaches_out  # no openWorldHint: open
    assert not tools["mcp__calc__double"].reaches_out  # openWorldHint false
    assert not tools["read_file"].reaches_out
    reach = waggle_bridge.reaches_out(tools)
    assert reach("mcp__calc__add") and not reach("mcp__calc__double") and not reach("read_file")
    assert reach("a_tool_the_member_does_not_have")  # unknown: assume the worst


def _pid(tools, ctx) -> int:
    text = run_tool(tools["mcp__calc__whoami"], ctx, {})
    assert text.startswith("pid="), text
    return int(text.split()[0].removeprefix("pid="))


def test_a_server_that_dies_is_restarted_on_the_next_call(space):
    declare(space)
    member = w1_of(space)
    tools, ctx = tools_for(member), ctx_of(member)
    first = _pid(tools, ctx)
    assert _pid(tools, ctx) == first  # one server per worker process, kept between calls
    os.kill(first, signal.SIGKILL)
    second = _pid(tools, ctx)
    assert second != first
    assert run_tool(tools["mcp__calc__note"], ctx, {"text": "x"}) == "noted: x"  # a mutating call after a death
    os.kill(second, signal.SIGKILL)
    time.sleep(0.2)  # let the reader see EOF: the ping before a mutating call must find it dead
    assert run_tool(tools["mcp__calc__note"], ctx, {"text": "y"}) == "noted: y"


def test_a_call_that_kills_the_server_is_an_error_and_the_next_call_works(space):
    declare(space)
    member = w1_of(space)
    tools, ctx = tools_for(member), ctx_of(member)
    assert run_tool(tools["mcp__calc__crash"], ctx, {}).startswith("error:")
    assert run_tool(tools["mcp__calc__add"], ctx, {"a": 1, "b": 1}) == "2"


@pytest.mark.parametrize("command, expected", [
    (["/nonexistent/mcp-server"], "could not start"),
    ([sys.executable, "-c", "import sys; print('bad config', file=sys.stderr); sys.exit(2)"], "bad config"),
])
def test_a_server_that_cannot_start_is_recorded_and_the_other_tools_keep_working(space, command, expected):
    declare(space, "broken", command=command, timeout=10)
    declare(space, "calc")
    tools = tools_for(w1_of(space))
    assert "read_file" in tools and "mcp__calc__add" in tools
    assert not any(name.startswith("mcp__broken__") for name in tools)
    broken = McpServer.objects.get(name="broken")
    assert "MCP server 'broken'" in broken.last_error and expected in broken.last_error


def test_stdio_servers_start_through_run_commands_sandbox(space, settings):
    settings.COMMAND_SANDBOX = "bwrap"
    row = declare(space, command=["my-server", "--flag", "a b"], env={"GREETING": "hello"})
    spec = spec_of(row, space.workdir)
    assert any(a.endswith("/bwrap") for a in spec.argv) and "--unshare-all" in spec.argv and "--cap-drop" in spec.argv
    # the env is the server's, not the host-side launcher's: it crosses under an inert name
    assert spec.argv[-5:] == ("/bin/sh", "-c", 'export GREETING="$VERONICA_CARRIED_0"; unset VERONICA_CARRIED_0; exec /bin/sh -c "$1"',
                              "sh", "my-server --flag 'a b'")
    assert dict(spec.env)["HOME"] == "/workspace" and dict(spec.env)["VERONICA_CARRIED_0"] == "hello" and "GREETING" not in dict(spec.env)


@pytest.fixture
def http_server():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, SERVER, "--http", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        proc.wait()


def test_a_streamable_http_server_works_like_a_stdio_one(space, http_server):
    declare(space, "web", url=http_server, timeout=10)
    member = w1_of(space)
    tools = tools_for(member)
    assert run_tool(tools["mcp__web__add"], ctx_of(member), {"a": 20, "b": 22}) == "42"
    assert tools["mcp__web__note"].needs_approval


def test_an_unreachable_http_server_is_recorded(space):
    declare(space, "gone", url="http://127.0.0.1:9/mcp", timeout=5)
    assert "read_file" in tools_for(w1_of(space))
    assert "MCP server 'gone'" in McpServer.objects.get().last_error


@pytest.mark.parametrize("url", ["http://169.254.169.254/latest/meta-data", "http://10.1.2.3:8080/mcp", "http://localhost:8000/mcp",
                                 "http://[::1]/mcp", "http://[::ffff:127.0.0.1]/mcp", "https://0.0.0.0/mcp", "http://app.localhost/mcp"])
def test_a_url_on_the_hosts_own_network_is_refused_when_declared(settings, url):
    from veronica.plumbing.errors import VeronicaError

    settings.MCP_ALLOW_HOSTS = []  # the hosted default
    with pytest.raises(VeronicaError) as caught:
        mcp_servers.check({"name": "inside", "url": url})
    assert caught.value.field == "mcp_servers.inside.url" and "VERONICA_MCP_ALLOW_HOSTS" in str(caught.value)
    settings.MCP_ALLOW_HOSTS = ["169.254.0.0/16", "10.0.0.0/8", "localhost", "::1", "127.0.0.1", "0.0.0.0", "app.localhost"]
    assert mcp_servers.check({"name": "inside", "url": url}).url == url  # the operator's allow-list lets it through


def test_the_default_allows_loopback_on_a_laptop_and_nothing_internal_when_hosted():
    from veronica import settings as defaults  # the module, not the fixture's override

    if defaults.HOSTED:
        assert defaults.MCP_ALLOW_HOSTS == []
    else:
        assert defaults.MCP_ALLOW_HOSTS == ["localhost", "127.0.0.0/8", "::1"]


def test_a_name_that_resolves_inside_at_connect_time_is_refused_there(space, http_server, settings, monkeypatch):
    """DNS rebinding: the name did not resolve (or resolved outside) when declared, and points at
    loopback when the worker connects. The guard resolves once, checks, and never connects."""
    from veronica.ops import outbound

    settings.MCP_ALLOW_HOSTS = []
    port = int(http_server.rsplit(":", 1)[1].split("/")[0])
    declare(space, "rebound", url=f"http://rebind.invalid:{port}/mcp", timeout=5)  # unresolvable now: saved
    real = outbound.resolve
    monkeypatch.setattr(outbound, "resolve", lambda host, p: [outbound.ipaddress.ip_address("127.0.0.1")]
                        if host == "rebind.invalid" else real(host, p))
    tools = tools_for(w1_of(space))
    assert not any(name.startswith("mcp__rebound__") for name in tools) and "read_file" in tools
    error = McpServer.objects.get(name="rebound").last_error
    assert "internal address" in error and "VERONICA_MCP_ALLOW_HOSTS" in error


@pytest.mark.parametrize("cfg, field", [
    ({"name": "Bad Name", "command": ["x"]}, "mcp_servers.name"),
    ({"name": "a"}, "mcp_servers.a"),
    ({"name": "a", "command": ["x"], "url": "http://h/mcp"}, "mcp_servers.a"),
    ({"name": "a", "command": "x y"}, "mcp_servers.a.command"),
    ({"name": "a", "url": "ftp://h/"}, "mcp_servers.a.url"),
    ({"name": "a", "command": ["x"], "env": {"K": 1}}, "mcp_servers.a.env.K"),
    ({"name": "a", "command": ["x"], "timeout": 0}, "mcp_servers.a.timeout"),
    ({"name": "a", "command": ["x"], "timeout": 301}, "mcp_servers.a.timeout"),
    ({"name": "a", "command": ["x"], "cwd": "/"}, "mcp_servers.cwd"),
])
def test_bad_declarations_name_the_field(cfg, field):
    from veronica.plumbing.errors import VeronicaError

    with pytest.raises(VeronicaError) as caught:
        mcp_servers.check(cfg)
    assert caught.value.field == field
