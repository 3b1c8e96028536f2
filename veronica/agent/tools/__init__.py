"""The tool registry a member's run sees."""
from __future__ import annotations

from veronica.agent.tools import memory, swarm, workspace
from veronica.agent.tools.base import Tool, ToolContext, ToolError, truncate

__all__ = ["Tool", "ToolContext", "ToolError", "tools_for", "truncate"]


def _waggle_tools() -> list[Tool]:
    try:
        from veronica.agent import waggle_bridge
    except ImportError:  # pragma: no cover - waggle is part of the project
        return []
    return waggle_bridge.tools()


def tools_for(role: str) -> dict[str, Tool]:
    tools = [*swarm.TOOLS, *workspace.TOOLS, *memory.TOOLS, *_waggle_tools()]
    return {t.name: t for t in tools if role == "leader" or not t.leader_only}
