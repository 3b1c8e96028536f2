"""The tool registry a member's run sees."""
from __future__ import annotations

from typing import TYPE_CHECKING

from veronica.agent.tools import memory, swarm, workspace
from veronica.agent.tools.base import Tool, ToolContext, ToolError, truncate
from veronica.plumbing.errors import VeronicaError

if TYPE_CHECKING:
    from veronica.models import Member

__all__ = ["Tool", "ToolContext", "ToolError", "check_tool_set", "deferred_block", "deferred_of", "offered_tools", "tools_for", "truncate"]
MAX_TOOL_NAMES = 200
MCP_PREFIX = "mcp__"
A2A_PREFIX = "a2a__"  # a remote A2A agent (veronica.agent.tools.a2a), matched when the run lists them


class ToolSetError(VeronicaError):
    """A member's tool set names a tool it cannot have."""


def _waggle_tools() -> list[Tool]:
    try:
        from veronica.agent import waggle_bridge
    except ImportError:  # pragma: no cover - waggle is part of the project
        return []
    return waggle_bridge.tools()


def builtin_tools(role: str) -> dict[str, Tool]:
    tools = [*swarm.TOOLS, *workspace.TOOLS, *memory.TOOLS, *_waggle_tools()]
    return {t.name: t for t in tools if role == "leader" or not t.leader_only}


def tools_for(who: "str | Member") -> dict[str, Tool]:
    """The built-in tools of a role; given a member, also its MCP servers' tools (listed now: call
    this once per run, at the run boundary). A built-in name always wins over an MCP one."""
    role = who if isinstance(who, str) else who.role
    found = builtin_tools(role)
    if not isinstance(who, str):
        from veronica.agent import runstart
        from veronica.agent.tools import a2a, mcp

        for tool in [] if runstart.empty("mcp") else mcp.tools_of(who):  # the claim found no server: no read
            found.setdefault(tool.name, tool)
        for tool in [] if runstart.empty("a2a") else a2a.tools_of(who):
            found.setdefault(tool.name, tool)
        found = offered_tools(who, found)  # its own tool set (active and deferred)
    return found


def _names(value: object, field: str) -> list[str]:
    if not isinstance(value, list) or len(value) > MAX_TOOL_NAMES or not all(isinstance(v, str) for v in value):
        raise ToolSetError(f"{field} must be a list of at most {MAX_TOOL_NAMES} tool names", field=field)
    return list(dict.fromkeys(v.strip() for v in value if v.strip()))


def check_tool_set(role: str, tools: object, deferred: object) -> tuple[list[str] | None, list[str]]:
    """A member's tool set as stored: `tools` None (every tool of the role) or a list of names, and the
    deferred names (offered too, but only named in the prompt until first used). Built-in names must
    exist for the role; MCP names (mcp__<server>__<tool>, or mcp__<server>__* for all of a server's)
    are matched when the run lists its servers."""
    listed = None if tools is None else _names(tools, "tools")
    later = _names(deferred if deferred is not None else [], "deferred_tools")
    known, every = builtin_tools(role), builtin_tools("leader")
    for field, names in (("tools", listed or []), ("deferred_tools", later)):
        for name in names:
            if name.startswith((MCP_PREFIX, A2A_PREFIX)) and len(name) > len(MCP_PREFIX) and len(name) <= 64:
                continue
            if name in every and name not in known:
                raise ToolSetError(f"{field}: '{name}' is a leader-only tool; a {role} cannot be offered it", field=field)
            if name not in known:
                raise ToolSetError(f"{field}: unknown tool '{name}' (built-in: {', '.join(sorted(known))}; "
                                   f"or mcp__<server>__<tool>)", field=field)
    both = sorted(set(listed or []) & set(later))
    if both:
        raise ToolSetError(f"deferred_tools: '{both[0]}' is also in tools; a tool is either active or deferred", field="deferred_tools")
    return listed, later


def _matches(name: str, patterns: list[str]) -> bool:
    return any(name == p or (p.endswith("__*") and name.startswith(p[:-1])) for p in patterns)


def offered_tools(member: "Member", found: dict[str, Tool]) -> dict[str, Tool]:
    """The member's tool set out of `found`: every tool it may call, active or deferred."""
    if member.tools is None:
        return found
    wanted = list(member.tools) + list(member.deferred_tools or [])
    return {name: tool for name, tool in found.items() if _matches(name, wanted)}


def deferred_of(member: "Member", tools: dict[str, Tool]) -> set[str]:
    """The offered tools not sent to the model until first used (named in the prompt instead)."""
    patterns = list(member.deferred_tools or [])
    return {name for name in tools if _matches(name, patterns)}


def deferred_block(tools: dict[str, Tool], deferred: set[str]) -> str | None:
    """The system prompt's list of deferred tools: enough to call one (its first call loads its schema)."""
    if not deferred:
        return None
    lines = ["# Deferred tools", "These tools are available but not loaded; call one by name and its full schema "
             "is loaded from then on:"]
    for name in sorted(deferred):
        schema = tools[name].spec()  # an MCP tool's comes from its server
        required = schema["parameters"].get("required") or []
        params = ", ".join(f"{p}{'' if p in required else '?'}" for p in schema["parameters"].get("properties") or {})
        lines.append(f"- {name}({params}): {schema['description']}")
    return "\n".join(lines)
