"""The provider interface: neutral messages in, one Reply out, usage read from the response."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol


class ProviderError(Exception):
    """A provider failed for good (after retries) or is misconfigured. The run ends in phase error."""


class Cancelled(Exception):
    """The run was cancelled (suspend / remove / lease lost) while waiting on the model."""


@dataclass
class ToolCall:
    id: str
    name: str
    args: dict


@dataclass
class Usage:
    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    estimated: bool = False

    @property
    def total(self) -> int:
        return self.input + self.output


@dataclass
class Reply:
    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)


# Messages are dicts: {"role": "user"|"assistant"|"tool", "content": str, "tool_calls": [...], "tool_call_id": str, "name": str}
CancelCheck = Callable[[], bool]


class Provider(Protocol):
    label: str

    def complete(self, system: str, messages: list[dict], tools: list[dict], *, should_stop: CancelCheck) -> Reply: ...
