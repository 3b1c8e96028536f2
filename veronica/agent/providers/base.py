"""The provider interface: neutral messages in, one Reply out, usage read from the response.

The engine's failure model (DESIGN §3) reads three things off a provider:
* `ProviderError.permanent`: transient errors (429, 5xx, 529, timeouts, malformed bodies) were
  already retried inside the call; the engine re-wakes with backoff. Permanent ones (401, 403,
  404, 400 / context overflow, missing key) park the member in phase `error` until an operator acts.
* `Reply.finish_reason`: "stop", "tool_calls", "length" (cut off at the token limit), "content_filter",
  or "" when the vendor said nothing. A "length" reply or an empty one is never a final answer.
* `Usage.estimated`: the vendor sent no usage and the figures are an estimate (never zero).
`on_event` (optional) receives live progress while a call is in flight: {"type": "text", "delta": str}
for streamed text and {"type": "retry", "delay": float, "reason": str} before a retry.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol


class ProviderError(Exception):
    """A provider failed after its own retries, or is misconfigured.

    permanent: retrying will not help (auth, not found, bad request, context overflow, missing key).
    usage: what the failed call cost, when the vendor reported it (it is metered all the same).
    """

    def __init__(self, message: str, *, permanent: bool = False, status: int | None = None,
                 request_id: str = "", retry_after: float | None = None, usage: "Usage | None" = None) -> None:
        super().__init__(message)
        self.permanent, self.status, self.request_id = permanent, status, request_id
        self.retry_after, self.usage = retry_after, usage


class Cancelled(Exception):
    """The run was cancelled (suspend / remove / lease lost) while waiting on the model."""


@dataclass
class ToolCall:
    id: str
    name: str
    args: dict


MAX_TOKENS_PER_CALL = 10_000_000  # per class: past any model's window, and inside the 32-bit counters


@dataclass
class Usage:
    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    estimated: bool = False

    def __post_init__(self) -> None:
        """A vendor's count is taken as a whole number in [0, MAX_TOKENS_PER_CALL]: a negative one
        lowered the day's meter (the breaker never tripped), one past 2^31 failed the step's write."""
        for name in ("input", "output", "cache_read", "cache_write"):
            value = getattr(self, name)
            try:
                value = int(value or 0)
            except (TypeError, ValueError, OverflowError):
                value = 0
            setattr(self, name, min(max(value, 0), MAX_TOKENS_PER_CALL))

    @property
    def total(self) -> int:
        """Every billed token: a cache read is billed input (at its own rate), so is a cache write.
        Budgets, Run.tokens and the turn's count use this; the classes stay apart for pricing."""
        return self.input + self.output + self.cache_read + self.cache_write


@dataclass
class Reply:
    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    finish_reason: str = ""
    model: str = ""  # the spec that answered, when a fallback chain chose it (else the member's model)

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    @property
    def empty(self) -> bool:
        return not self.text.strip() and not self.tool_calls


# Messages are dicts: {"role": "user"|"assistant"|"tool", "content": str, "tool_calls": [...], "tool_call_id": str, "name": str}
CancelCheck = Callable[[], bool]
EventSink = Callable[[dict], None]


class Provider(Protocol):
    label: str

    def complete(self, system: str, messages: list[dict], tools: list[dict], *, should_stop: CancelCheck,
                 on_event: EventSink | None = None) -> Reply: ...
