"""The tool registry a member's run sees."""
from __future__ import annotations

from typing import TYPE_CHECKING

from veronica.agent.tools import memory, swarm, workspace
from veronica.agent.tools.base import Tool, ToolContext, ToolError, truncate

if TYPE_CHECKING:
    from veronica.models import Member

__all__ = ["Tool", "ToolContext", "ToolError", "tools_for", "truncate"]


def _waggle_tools() -> list[Tool]:
    try:
        from veronica.agent import waggle_bridge
    except ImportError:  # pragma: no cover - waggle is part of the project
        return []
    return waggle_bridge.tools()


def tools_for(who: "str | Member") -> dict[str, Tool]:
    """The built-in tools of a role; given a member, also its MCP servers' tools (listed now: call
    this once per run, at the run boundary). A built-in name always wins over an MCP one."""
    role = who if isinstance(who, str) else who.role
    tools = [*swarm.TOOLS, *workspace.TOOLS, *memory.TOOLS, *_waggle_tools()]
    found = {t.name: t for t in tools if role == "leader" or not t.leader_only}
    if not isinstance(who, str):
        from veronica.agent.tools import mcp

        for tool in mcp.tools_of(who):
            found.setdefault(tool.name, tool)
    return found
