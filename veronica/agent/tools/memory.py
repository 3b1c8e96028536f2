"""Memory tools: a member reads, lists and writes its own memory files (veronica.swarm.memory)."""
from __future__ import annotations

from veronica.swarm import memory
from veronica.agent.tools.base import S, Tool, ToolContext, ToolError, arg_str, truncate


def memory_list(ctx: ToolContext, args: dict) -> str:
    rows = memory.index(ctx.member)
    if not rows:
        return "(no memory files)"
    files, used = len(rows), sum(r["chars"] for r in rows)
    lines = [f"- {r['name']} ({r['chars']} chars, updated {r['updated_at']:%Y-%m-%d %H:%M} UTC) — {r['description']}" for r in rows]
    return "\n".join(lines + [f"{files} file(s), {used} characters in all"])


def memory_read(ctx: ToolContext, args: dict) -> str:
    row = memory.get(ctx.member, arg_str(args, "name", max_len=200))
    return truncate(row.content) if row.content else f"({row.name} is empty)"


def memory_write(ctx: ToolContext, args: dict) -> str:
    mode = arg_str(args, "mode", required=False, default="replace")
    if mode not in ("replace", "append"):
        raise ToolError("argument 'mode' must be 'replace' or 'append'")
    # the cap check in memory.write names the limit; arg_str's bound only stops absurd arguments
    content = arg_str(args, "content", max_len=10 * 1024 * 1024)
    row = memory.write(ctx.member, arg_str(args, "name", max_len=200), content, actor=ctx.member.name, append=mode == "append")
    return f"{'appended to' if mode == 'append' else 'wrote'} {row.name} ({len(row.content)} characters)"


TOOLS = [
    Tool("memory_list", "List your memory files: names, sizes, first lines.", memory_list),
    Tool("memory_read", "Read one of your memory files in full.", memory_read, {"name": S}, ("name",)),
    Tool("memory_write", "Create, replace or append to one of your memory files (markdown; size-capped).", memory_write,
         {"name": S, "content": S, "mode": {"type": "string", "enum": ["replace", "append"]}}, ("name", "content"), mutates=True),
]
