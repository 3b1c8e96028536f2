"""MCP servers' tools as member tools, named `mcp__<server>__<tool>`.

Listed once per run (the run boundary). A tool the server annotates `readOnlyHint` is read-only
(waggle may record and replay it); any other one mutates and so goes through the permission gate
like write_file. A server that cannot start or list is recorded on its row (the console shows it)
and left out of this run: the member's other tools keep working."""
from __future__ import annotations

import hashlib
import json
import logging
import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.db.models import Q
from django.utils import timezone

from veronica.agent.mcp_client import McpUnavailable, ServerSpec, manager
from veronica.agent.tools.base import Tool, ToolContext, ToolError
from veronica.plumbing.compiled_select import fetch
from veronica.plumbing.errors import storable

if TYPE_CHECKING:
    from veronica.models import McpServer, Member

log = logging.getLogger(__name__)
NAME_LIMIT = 64  # OpenAI's and Anthropic's limit on a tool name: ^[a-zA-Z0-9_-]{1,64}$
UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def tool_name(server: str, tool: str) -> str:
    name = f"mcp__{server}__{UNSAFE.sub('_', tool)}"
    if len(name) <= NAME_LIMIT:
        return name
    digest = hashlib.sha1(tool.encode()).hexdigest()[:8]  # keeps two long names that share a prefix apart
    return f"{name[:NAME_LIMIT - 9]}_{digest}"


@dataclass
class McpTool(Tool):
    schema: dict | None = None  # the server's inputSchema, offered as is

    def spec(self) -> dict:
        if not self.schema:
            return super().spec()
        parameters = {"type": "object", "properties": self.schema.get("properties", {}), "required": self.schema.get("required", [])}
        if "$defs" in self.schema:  # nested argument models refer to these
            parameters["$defs"] = self.schema["$defs"]
        return {"name": self.name, "description": self.description, "parameters": parameters}


def servers_for(member: "Member"):
    return servers_for_ids(member.space_id, member.pk)


def servers_for_ids(space_id: int, member_id: int):
    from veronica.models import McpServer

    return McpServer.objects.filter(Q(member__isnull=True) | Q(member_id=member_id), space_id=space_id).order_by("name", "pk")


def spec_of(server: "McpServer", workdir: str, member: "Member | None" = None) -> ServerSpec:
    """stdio servers start exactly like run_command: the same sandbox wrapper, in the workspace.
    `${secret:NAME}` in an env value is the member's (or the space's) secret NAME (veronica.swarm.secrets)."""
    from pathlib import Path

    from veronica.swarm import secrets
    from veronica.agent.tools.workspace import sandbox_env, sandboxed
    from veronica.plumbing.errors import VeronicaError

    try:
        resolved = secrets.resolve_env(server.env or {}, server.space_id, member or server.member, where=f"mcp_servers.{server.name}")
    except (VeronicaError, secrets.secret_store.KeyMissing) as exc:
        raise ToolError(str(exc)) from None
    if server.transport == "http":
        return ServerSpec(key=server.pk, name=server.name, transport="http", url=server.url, timeout=server.timeout)
    root = Path(workdir).resolve()
    carry = {str(k): str(v) for k, v in resolved.items()}  # the server's env, never the host-side launcher's
    argv, home = sandboxed(root, shlex.join(server.command), carry)
    return ServerSpec(key=server.pk, name=server.name, transport="stdio", argv=tuple(argv), cwd=str(root),
                      env=tuple(sorted(sandbox_env(home, carry).items())), timeout=server.timeout)


def _record(server: "McpServer", error: str, tools: list[dict] | None) -> None:
    from veronica.models import McpServer

    # A server's words are kept, not refused: one NUL or lone surrogate in a tool's name or in its
    # stderr made this write raise, and with it every run of the member.
    from veronica.plumbing.secret_store import mask

    fields = {"last_error": storable(mask(error, server.space_id)[:2000]), "checked_at": timezone.now()}
    if tools is not None:
        fields["tools_cached"] = storable(tools)
    McpServer.objects.filter(pk=server.pk).update(**fields)


def _text(result) -> str:
    parts = []
    for block in result.content:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource_link":
            parts.append(f"[resource {block.uri}]")
        elif kind == "resource":
            parts.append(getattr(block.resource, "text", None) or f"[resource {block.resource.uri}]")
        else:
            parts.append(f"[{kind} content omitted]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, default=str))
    return "\n".join(parts) or "(no output)"


def _caller(spec: ServerSpec, remote: str, read_only: bool):
    def call(ctx: ToolContext, args: dict) -> str:
        try:
            result = manager().call(spec, remote, args, read_only=read_only)
        except McpUnavailable as exc:
            raise ToolError(str(exc)) from None
        except Exception as exc:  # MCPError, timeouts, transport errors: the model reads them
            raise ToolError(f"MCP server '{spec.name}' failed on {remote}: {exc}") from None
        text = _text(result)
        if result.is_error:
            raise ToolError(f"{remote} reported an error: {text}")
        return text
    return call


def check(server: "McpServer", workdir: str, member: "Member | None" = None) -> tuple[ServerSpec, list] | None:
    """Start (or reuse) the server and list its tools; the outcome is recorded on its row."""
    try:
        spec = spec_of(server, workdir, member)
        listed = manager().list_tools(spec)
    except (McpUnavailable, ToolError) as exc:
        log.warning("MCP server %s unavailable: %s", server.name, exc)
        _record(server, str(exc), None)
        return None
    cached = [{"name": info.name, "read_only": _read_only(info)} for info in listed]
    if server.last_error or server.tools_cached != cached or server.checked_at is None:
        _record(server, "", cached)
    return spec, listed


def _read_only(info) -> bool:
    return bool(info.annotations and info.annotations.read_only_hint)


def _closed_world(info) -> bool:
    """Declared closed-world (openWorldHint false); MCP's default is open: the tool may reach anything."""
    return bool(info.annotations) and info.annotations.open_world_hint is False


def tools_of(member: "Member") -> list[Tool]:
    """The tools of every MCP server the member may use; a broken server is skipped (and recorded)."""
    found: list[Tool] = []
    for server in fetch(("mcp-servers-of",), lambda s: servers_for_ids(s.int("space"), s.int("member")),
                        {"space": member.space_id, "member": member.pk}):  # servers_for, compiled once: read every run
        checked = check(server, member.space.workdir, member)
        if checked is None:
            continue
        spec, listed = checked
        for info in listed:
            read_only = _read_only(info)
            description = (info.description or info.title or info.name)[:1000]
            schema = {k: v for k, v in (info.input_schema or {}).items() if k in ("properties", "required", "$defs")}
            found.append(McpTool(tool_name(server.name, info.name), f"[MCP {server.name}] {description}",
                                 _caller(spec, info.name, read_only), mutates=not read_only, schema=schema,
                                 reaches_out=not _closed_world(info)))
    return found
