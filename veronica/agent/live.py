"""Live progress of a model call, for the console: the provider's `on_event` sink.

Streamed text becomes `agent.delta` events, throttled (at most one every `EVERY` seconds, never one
per token: each is a row in the event log) and the phase `texting`, which rides the first delta's fence
(a reply streamed within `EVERY` shows no preview and costs no commit for its phase); a retry becomes an
`agent.retry` event and the phase detail "retrying in 8 s: HTTP 529 overloaded". The final text is
still the `agent.text` event the loop emits with the persisted turn; deltas are only a preview.
"""
from __future__ import annotations

import time

from veronica.swarm import events
from veronica.agent.runctx import LeaseLost
from veronica.plumbing.errors import storable
from veronica.models import Member, Phase

EVERY = 0.25
MAX_DELTA = 4000


class LiveSink:
    def __init__(self, member: Member, ctx, every: float = EVERY, clock=time.monotonic) -> None:
        self.member, self.ctx, self.every, self.clock = member, ctx, every, clock
        self.pending = ""
        self.sent = 0  # characters already published for this attempt
        self.last = 0.0
        self.deferred = False  # the texting phase waits for the first delta's fence

    def __call__(self, event: dict) -> None:
        if event.get("type") == "text":
            self.text(event.get("delta") or "")
        elif event.get("type") == "retry":
            self.retry(float(event.get("delay") or 0), str(event.get("reason") or "error"))
        elif event.get("type") == "fallback":
            self.fallback(str(event.get("from") or ""), str(event.get("to") or ""), str(event.get("reason") or "error"))
        elif event.get("type") == "queued":
            self.ctx.phase(Phase.THINKING, f"queued for {event.get('limit')}"[:60])

    def fallback(self, old: str, new: str, reason: str) -> None:
        """The model is overloaded or down: the same request goes to the next model of the chain."""
        self.pending, self.sent, reason = "", 0, storable(reason)
        detail = f"switched to {new}: {reason}"
        self.emit("model.fallback", **{"from": old, "to": new, "reason": reason, "text": f"{old} failed ({reason}); {detail}"})
        self.ctx.phase(Phase.THINKING, detail[:60])

    def text(self, delta: str) -> None:
        if not delta:
            return
        if self.sent == 0 and not self.pending:
            later = getattr(self.ctx, "next_phase", None)
            if later is None:
                self.ctx.phase(Phase.TEXTING)
            else:  # written with the first preview: a fenced commit of its own per call was most of a step's cost
                later(Phase.TEXTING)
                self.deferred = True
            self.last = self.clock()
        self.pending += delta
        if self.clock() - self.last >= self.every:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        piece, self.pending = self.pending[:MAX_DELTA], ""
        self.emit("agent.delta", offset=self.sent, text=storable(piece))  # a vendor's raw text, kept
        self.sent += len(piece)
        self.last = self.clock()
        self.deferred = False

    def close(self) -> None:
        """The call is over: a texting phase no preview carried is dropped, not left for the step's
        fence (which writes the phase after the call, or none in a fused step)."""
        if self.deferred:
            self.deferred = False
            self.ctx.next_phase(self.ctx.member.phase, self.ctx.member.phase_tool)  # the current phase: writes nothing

    def retry(self, delay: float, reason: str) -> None:
        """The next attempt streams from the start: the console drops the preview it has."""
        self.pending, self.sent, reason = "", 0, storable(reason)
        detail = f"retrying in {delay:.0f} s: {reason}" if delay >= 1 else f"retrying: {reason}"
        self.emit("agent.retry", delay=delay, reason=reason, text=detail)
        self.ctx.phase(Phase.THINKING, detail[:60])

    def emit(self, kind: str, **payload) -> None:
        """Fenced like every write of the run; a lost lease drops the preview (should_stop ends the call)."""
        try:
            with self.ctx.fenced():
                events.emit(self.member.space_id, kind, member=self.member, **payload)
        except LeaseLost:
            pass
