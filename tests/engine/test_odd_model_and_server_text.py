"""Text from the model, an MCP server or the vendor's stream that failed the run's writes: over-long tool
names and call ids, NUL and lone surrogates in an MCP tool list, its error text and the live preview."""
from __future__ import annotations

import sys
import time

import pytest

from veronica.swarm import bus, mcp_servers
from veronica.agent.providers.base import Reply, ToolCall, Usage
from veronica.agent.tools import mcp, tools_for
from veronica.engine import runner, supervisor
from veronica.models import Approval, McpServer, Turn


def _wake_w1(space):
    bus.send(space, "boss", "w1", "go")
    return runner.wake(supervisor.get_member(space, "w1").pk, "message")


def _with_a_server(space) -> None:
    """A server row for the tests that stand in for its tools (mcp.tools_of): a run's claim that finds no
    server skips the listing (veronica.agent.runstart)."""
    McpServer.objects.create(space=space, name="search", transport="http", url="http://127.0.0.1:9/mcp")


def _wake_w1_with_tools(space):
    _with_a_server(space)
    bus.send(space, "boss", "w1", "go")
    return runner.wake(supervisor.get_member(space, "w1").pk, "message")


# --- 1. tool names of 61-64 characters / call ids over 80 -----------------------------------------

LONG_MCP = mcp.tool_name("search", "find_documents_matching_the_query_in_the_index_of_everything")  # 64 chars


def test_an_mcp_tool_with_a_64_character_name_runs(space, scripted, monkeypatch):
    assert len(LONG_MCP) == mcp.NAME_LIMIT == 64
    tool = mcp.McpTool(LONG_MCP, "[MCP search] find", lambda ctx, args: "found", mutates=False)
    monkeypatch.setattr(mcp, "tools_of", lambda member: [tool])
    scripted((LONG_MCP, {}), "done")
    assert _wake_w1_with_tools(space) == "done"
    assert Turn.objects.get(role="tool").content == "found"


def test_a_gated_mcp_tool_with_a_64_character_name_is_held(space, scripted, monkeypatch):
    tool = mcp.McpTool(LONG_MCP, "[MCP search] find", lambda ctx, args: "found", mutates=True)
    monkeypatch.setattr(mcp, "tools_of", lambda member: [tool])
    supervisor.set_permission_mode(supervisor.get_member(space, "w1"), "default", actor="op")
    scripted((LONG_MCP, {}), "done")
    assert _wake_w1_with_tools(space) == "waiting"
    assert Approval.objects.get().tool_name == LONG_MCP


def test_a_hallucinated_61_character_tool_name_is_an_error_result(space, scripted):
    scripted(("x" * 61, {}), "done")
    assert _wake_w1(space) == "done"
    assert Turn.objects.get(role="tool").content.startswith("error: unknown tool")


def test_a_tool_call_id_over_80_characters_is_kept(space, scripted):
    scripted(Reply(tool_calls=[ToolCall(id="i" * 81, name="list_dir", args={})], usage=Usage(input=100, output=10)), "done")
    assert _wake_w1(space) == "done"


# --- 2. an MCP server's tool list / error text --------------------------------------------------------

def _server(space, monkeypatch, *, listed=None, error=None):
    from veronica.agent.mcp_client import Manager, McpUnavailable

    mcp_servers.add(space, mcp_servers.check({"name": "odd", "command": [sys.executable, "-c", "pass"]}), actor="t")

    def list_tools(self, spec):
        if error is not None:
            raise McpUnavailable(error)
        return listed

    monkeypatch.setattr(Manager, "list_tools", list_tools)


def test_an_mcp_tool_named_with_a_nul_does_not_break_the_members_tools(space, monkeypatch):
    from mcp.types import Tool as Info  # the SDK's JSON parser passes "\u0000" through

    _server(space, monkeypatch, listed=[Info(name="a\x00b", inputSchema={"type": "object"})])
    assert "mcp__odd__a_b" in tools_for(supervisor.get_member(space, "w1"))


@pytest.mark.parametrize("error", ["could not start (stderr: \x00boom)", "could not start: \ud800"])
def test_an_mcp_servers_odd_error_text_is_recorded(space, monkeypatch, error):
    _server(space, monkeypatch, error=error)
    assert "read_file" in tools_for(supervisor.get_member(space, "w1"))
    assert McpServer.objects.get().last_error


# --- 3. the vendor's stream (deltas, retry reasons) ------------------------------------------------------

class Streaming:
    label = "streaming"

    def __init__(self, event):
        self.event = event

    def complete(self, system, messages, tools, *, should_stop, on_event=None):
        on_event(self.event)
        time.sleep(0.3)  # past LiveSink's 0.25 s throttle: the next delta flushes
        on_event({"type": "text", "delta": "."})
        return Reply(text="hi there", usage=Usage(input=100, output=10))


@pytest.mark.parametrize("event", [
    {"type": "text", "delta": "hi\x00"}, {"type": "text", "delta": "hi\ud800"},
    {"type": "retry", "delay": 2, "reason": "HTTP 500: \x00"}, {"type": "retry", "delay": 2, "reason": "HTTP 500: \ud800"},
])
def test_odd_text_in_the_stream_does_not_fail_the_run(space, monkeypatch, event):
    monkeypatch.setattr("veronica.agent.loop.get_provider", lambda spec: Streaming(event))
    assert _wake_w1(space) == "done"


# --- 4. depends_on past the integer range ----------------------------------------------------------------

def test_task_create_with_a_huge_dependency_id_is_a_readable_error(space):
    from veronica.agent.loop import run_tool
    from veronica.agent.tools import ToolContext

    boss = supervisor.get_member(space, "boss")
    result = run_tool(tools_for("leader")["task_create"], ToolContext(member=boss, space=space),
                      {"title": "t", "depends_on": [10**20]})
    assert result.startswith("error:") and "unexpectedly" not in result, result


@pytest.mark.parametrize("ids", [("same", "same"), ("", ""), ("bad id\x00", "ok"), ("i" * 81, "i" * 81)])
def test_call_ids_that_are_empty_repeated_or_odd_are_replaced_so_each_result_pairs_with_its_call(space, scripted, ids):
    from veronica.agent import transcript
    from veronica.models import Session

    scripted(Reply(tool_calls=[ToolCall(id=i, name="list_dir", args={}) for i in ids], usage=Usage(input=100, output=10)),
             "done")
    assert _wake_w1(space) == "done"
    rows = list(Session.objects.get(member__name="w1").turns.order_by("seq"))
    called = [c["id"] for c in next(t for t in rows if t.tool_calls).tool_calls]
    answered = [t.tool_call_id for t in rows if t.role == "tool"]
    assert called == answered and len(set(called)) == 2, (called, answered)
    assert all(len(i) <= 80 for i in called)
    messages = transcript.to_messages(rows)
    assert [m["tool_call_id"] for m in messages if m["role"] == "tool"] == called


# --- 3. numbers JSON has no word for --------------------------------------------------------------------

def test_tool_arguments_with_nan_or_infinity_are_stored_as_null(space, scripted):
    """Python's json.loads reads NaN and Infinity (what a vendor SDK parses arguments with); PostgreSQL's
    json refuses them: the step's writes failed, every retry of it."""
    args = {"path": "f.txt", "offset": float("nan"), "limit": float("inf"), "deep": [float("-inf"), 1.5]}
    scripted(Reply(tool_calls=[ToolCall(id="c1", name="list_dir", args=args)], usage=Usage(input=100, output=10)), "done")
    assert _wake_w1(space) == "done"
    stored = Turn.objects.filter(role="assistant").exclude(tool_calls=[]).get().tool_calls[0]["args"]
    assert stored == {"path": "f.txt", "offset": None, "limit": None, "deep": [None, 1.5]}
