"""What the agent runtime needs from whoever runs it: the run context protocol.

The engine implements it (veronica.engine.slot.RunLease); the agent only ever sees this protocol,
so the engine calls the agent and never the reverse. Every write a run makes goes through
`fenced()`: a transaction that first renews the run's lease and aborts when the lease is gone, so a
run that lost its slot (paused past its lease, taken over by the watchdog) writes nothing more.
"""
from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Callable, Protocol, TypeVar

if TYPE_CHECKING:
    from veronica.models import Member, Run

T = TypeVar("T")


class Cancelled(Exception):
    """Suspend / remove asked the run to stop: it ends `aborted` at its next step."""


class LeaseLost(Cancelled):
    """The run's lease expired or was taken over: the run writes nothing more and stops."""


# Set by keep_alive for the tool call it runs: a tool that waits (a command, an MCP call) polls it and
# stops at once when the run is asked to stop, rather than finishing first.
STOP: ContextVar[threading.Event | None] = ContextVar("veronica_tool_stop", default=None)


def stop_requested() -> bool:
    event = STOP.get()
    return event is not None and event.is_set()


class RunContext(Protocol):
    member: "Member"
    run: "Run"
    source: str

    def check(self) -> None:
        """Between steps: renew the lease; raise Cancelled (asked to stop) or LeaseLost."""

    def should_stop(self) -> bool:
        """Polled while a model call is in flight (renews the lease at most once a second)."""

    def stop_reason(self) -> Cancelled:
        """Why should_stop said yes (a LeaseLost or a Cancelled)."""

    def fenced(self) -> AbstractContextManager[None]:
        """A transaction whose writes commit only while this run still holds its lease."""

    def keep_alive(self, fn: Callable[[], T]) -> T:
        """Run a long step (a tool call) in a helper thread while the lease is renewed; a stop asked for
        meanwhile sets STOP in the step's context, so the tool ends its command and says so."""

    def phase(self, phase: str, tool: str = "", *, step: bool = False) -> None:
        """Report the member's phase (a fenced write and its event). step: a new model or tool call
        begins; in an unchanged phase it still counts as progress (re-stamps phase_since, no event)."""

    # Optional (the loop falls back when a context lacks them):
    # permission_mode: str — the member's permission mode as read by the run's latest fence;
    # next_phase(phase, tool="") — the phase the next fence writes, in its own statement;
    # idle() — the run is about to wait on its model: it gives its database connection back.
