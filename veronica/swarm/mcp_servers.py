"""The MCP server verbs: declare one for a space (every member) or one member, remove it. The console
and the manifest both validate through `check`, so both refuse the same things with the same words."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from django.db import transaction

from veronica.swarm import audit, events
from veronica.ops import outbound
from veronica.plumbing.errors import Conflict, NotFound, VeronicaError, column_limit, text_problem
from veronica.models import McpServer, McpTransport, Member, Space

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
TIMEOUT_RANGE = (1, 300)
MAX_ARGS, MAX_ARG, MAX_ENV, MAX_ENV_VALUE = 64, 1000, 50, 4000
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
KEYS = {"name", "command", "url", "env", "timeout"}


@dataclass
class ServerConfig:
    name: str
    transport: str
    command: list[str] = field(default_factory=list)
    url: str = ""
    env: dict[str, str] = field(default_factory=dict)
    timeout: int = 30


def _fail(field_name: str, problem: str) -> None:
    raise VeronicaError(problem, field=field_name)


def check(cfg: dict) -> ServerConfig:
    """One declaration ({name, command | url, env, timeout}) checked; errors name the field."""
    if not isinstance(cfg, dict):
        _fail("mcp_servers", "each entry must be a table with name and command or url")
    unknown = sorted(set(cfg) - KEYS)
    if unknown:
        _fail(f"mcp_servers.{unknown[0]}", f"unknown key (known: {', '.join(sorted(KEYS))})")
    name, limit = cfg.get("name"), column_limit(McpServer, "name")
    if not isinstance(name, str) or not NAME_RE.match(name) or len(name) > limit:
        _fail("mcp_servers.name", f"lowercase letters, digits, '-' or '_', 1 to {limit} characters, starting with a letter or digit")
    command, url = cfg.get("command"), cfg.get("url")
    if (command is None) == (url is None or url == ""):
        _fail(f"mcp_servers.{name}", "give either command (a stdio server) or url (a streamable-HTTP server), not both")
    if command is not None:
        if not isinstance(command, list) or not command or len(command) > MAX_ARGS \
                or not all(isinstance(a, str) and a and len(a) <= MAX_ARG and not text_problem(a) for a in command):
            _fail(f"mcp_servers.{name}.command", f"must be a list of 1 to {MAX_ARGS} non-empty strings (each at most {MAX_ARG} characters)")
    else:
        ulimit = column_limit(McpServer, "url")
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc or len(url) > ulimit or text_problem(url):
            _fail(f"mcp_servers.{name}.url", f"must be an http:// or https:// URL of at most {ulimit} characters")
        outbound.check_url(url, f"mcp_servers.{name}.url", outbound.MCP)  # no internal addresses (SSRF)
    env = cfg.get("env", {})
    if not isinstance(env, dict) or len(env) > MAX_ENV:
        _fail(f"mcp_servers.{name}.env", f"must be a table of at most {MAX_ENV} NAME = \"value\" strings")
    for key, value in env.items():
        if not ENV_KEY_RE.match(key) or not isinstance(value, str) or len(value) > MAX_ENV_VALUE or text_problem(value):
            _fail(f"mcp_servers.{name}.env.{key}", f"names are letters, digits and '_'; values strings of at most {MAX_ENV_VALUE} characters")
    timeout = cfg.get("timeout", 30)
    low, high = TIMEOUT_RANGE
    if not isinstance(timeout, int) or isinstance(timeout, bool) or not low <= timeout <= high:
        _fail(f"mcp_servers.{name}.timeout", f"must be an integer number of seconds from {low} to {high}")
    return ServerConfig(name=name, transport=McpTransport.STDIO if command is not None else McpTransport.HTTP,
                        command=list(command or []), url=url or "", env=dict(env), timeout=timeout)


def check_list(entries: object) -> list[ServerConfig]:
    if not isinstance(entries, list):
        _fail("mcp_servers", "must be an array of tables ([[mcp_servers]])")
    configs = [check(e) for e in entries]
    names = [c.name for c in configs]
    for name in names:
        if names.count(name) > 1:
            _fail(f"mcp_servers.{name}", "declared twice")
    return configs


@audit.verb("mcp.add", created=True)
def add(space: Space, cfg: ServerConfig, *, member: Member | None = None, actor: str, from_manifest: bool = False) -> McpServer:
    scope = McpServer.objects.filter(space=space, member=member)
    if scope.filter(name=cfg.name).exists():
        raise Conflict(f"an MCP server named '{cfg.name}' is already declared here", field="name")
    with transaction.atomic():
        server = McpServer.objects.create(space=space, member=member, name=cfg.name, transport=cfg.transport, command=cfg.command,
                                          url=cfg.url, env=cfg.env, timeout=cfg.timeout, from_manifest=from_manifest)
        events.emit(space.pk, "mcp.added", member=member, actor=actor, server=cfg.name, transport=cfg.transport)
    return server


@audit.verb("mcp.remove")
def remove(space: Space, name: str, *, member: Member | None = None, actor: str) -> None:
    with transaction.atomic():
        deleted, _ = McpServer.objects.filter(space=space, member=member, name=name).delete()
        if not deleted:
            raise NotFound(f"no MCP server named '{name}'" + (f" for {member.name}" if member else " for the space"), field="name")
        events.emit(space.pk, "mcp.removed", member=member, actor=actor, server=name)


def env_from_lines(text: str) -> dict[str, str]:
    """KEY=VALUE per line (blank lines skipped); the field is named on a line without '='."""
    env = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise VeronicaError(f"line {number} is not KEY=VALUE", field="env")
        env[key.strip()] = value
    return env


@audit.verb("mcp.set_env", created=True)
def set_env(space: Space, name: str, lines: str, *, member: Member | None = None, actor: str) -> McpServer:
    """Replace a server's environment from KEY=VALUE lines without ever showing the old values:
    `KEY=` with nothing after it keeps KEY's current value (how an owner edits one secret, or fills
    in those an export scrubbed); a key left out is removed. Checked like a declaration; the next
    call starts the server again with it (the connection depends on its env)."""
    with transaction.atomic():
        server = McpServer.objects.select_for_update().filter(space=space, member=member, name=name).first()
        if server is None:
            raise NotFound(f"no MCP server named '{name}'" + (f" for {member.name}" if member else " for the space"), field="name")
        given = env_from_lines(lines)
        env = {key: value if value != "" else server.env.get(key, "") for key, value in given.items()}
        declared = {"name": server.name, "env": env, "timeout": server.timeout,
                    **({"url": server.url} if server.transport == McpTransport.HTTP else {"command": server.command})}
        server.env = check(declared).env
        server.save(update_fields=["env"])
        events.emit(space.pk, "mcp.updated", member=member, actor=actor, server=name, env=sorted(server.env))
    return server


@audit.verb("mcp.replace_from_manifest")
def replace_from_manifest(space: Space, member: Member | None, configs: list[ServerConfig], *, actor: str) -> None:
    """A register: the manifest's servers replace the earlier manifest's; console-added ones stay
    unless the manifest now declares the same name (the manifest wins)."""
    McpServer.objects.filter(space=space, member=member).filter(
        from_manifest=True).delete()
    McpServer.objects.filter(space=space, member=member, name__in=[c.name for c in configs]).delete()
    for cfg in configs:
        add(space, cfg, member=member, actor=actor, from_manifest=True)


def from_form(data) -> ServerConfig:
    """The console's add form: the command as one shell-quoted line, env as KEY=VALUE lines."""
    import shlex

    cfg: dict = {"name": data.get("name", "").strip()}
    command, url = data.get("command", "").strip(), data.get("url", "").strip()
    if command:
        try:
            cfg["command"] = shlex.split(command)
        except ValueError as exc:
            raise VeronicaError(f"is not a valid command line ({exc})", field="command") from None
    if url:
        cfg["url"] = url
    cfg["env"] = env_from_lines(data.get("env", ""))
    timeout = data.get("timeout", "").strip() or "30"
    try:
        cfg["timeout"] = int(timeout)
    except ValueError:
        raise VeronicaError(f"timeout must be a whole number of seconds from {TIMEOUT_RANGE[0]} to {TIMEOUT_RANGE[1]}",
                            field="timeout") from None
    return check(cfg)
