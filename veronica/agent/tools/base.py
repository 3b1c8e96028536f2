"""Tool plumbing: each tool declares its schema, whether it mutates, and whether the permission
gate holds it in `default` mode (coordination tools like send_message mutate but are not gated)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from veronica.models import Member, Run, Session, Space

MAX_RESULT_CHARS = 12000


class ToolError(Exception):
    """A tool failed in a way the model should read and can react to."""


@dataclass
class ToolContext:
    member: "Member"
    space: "Space"
    session: "Session | None" = None
    run: "Run | None" = None
    log: object = None  # the run's in-memory transcript (veronica.agent.transcript.Log), when a run owns it
    tools: "dict[str, Tool] | None" = None  # the run's tool table (tools_for at the run boundary), when a run owns it:
                                            # waggle_run replays a route through it


@dataclass
class Tool:
    name: str
    description: str
    fn: Callable[[ToolContext, dict], str]
    params: dict = field(default_factory=dict)
    required: tuple[str, ...] = ()
    mutates: bool = False
    gated: bool | None = None  # None: gated iff it mutates
    leader_only: bool = False
    reaches_out: bool = False  # it reaches outside the space (network, an open-world MCP server): a replay never
                               # passes it a value from a tool's output (waggle)

    @property
    def needs_approval(self) -> bool:
        return self.mutates if self.gated is None else self.gated

    def spec(self) -> dict:
        return {"name": self.name, "description": self.description,
                "parameters": {"type": "object", "properties": self.params, "required": list(self.required)}}


def truncate(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n… [truncated: {len(text) - limit} more characters]"


def arg_str(args: dict, key: str, *, required: bool = True, default: str = "", max_len: int = 20000) -> str:
    value = args.get(key, None)
    if value is None:
        if required:
            raise ToolError(f"missing required argument '{key}'")
        return default
    if not isinstance(value, (str, int, float)):
        raise ToolError(f"argument '{key}' must be a string")
    value = str(value)
    if len(value) > max_len:
        raise ToolError(f"argument '{key}' is {len(value)} characters; the limit is {max_len}")
    return value


def arg_int(args: dict, key: str, *, default: int | None = None, minimum: int | None = None, maximum: int | None = None) -> int:
    value = args.get(key, default)
    if value is None:
        raise ToolError(f"missing required argument '{key}'")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ToolError(f"argument '{key}' must be an integer") from None
    if minimum is not None and number < minimum or maximum is not None and number > maximum:
        raise ToolError(f"argument '{key}' must be between {minimum} and {maximum}")
    return number


S = {"type": "string"}
I = {"type": "integer"}
