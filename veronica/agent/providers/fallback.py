"""A member's fallback chain: `model = "anthropic:X"`, `fallback = ["openai:Y"]`. When a call fails
with an overload or an outage after the SDK wrapper's own retries (429, 5xx, 529, timeouts,
connection errors: a transient ProviderError), the same request goes to the next model of the chain.
The switch is told to `on_event` ({"type": "fallback", ...}: the console's event and phase detail),
and the reply says which model answered (`Reply.model`: the trace span and the usage carry it).
A permanent error of the member's own model (bad key, bad request) is not an outage: it parks the
member as before. The chain stays on the model that answered for the rest of the run.
"""
from __future__ import annotations

from typing import Callable

from veronica.agent.providers.base import Provider, ProviderError, Reply


class FallbackProvider:
    def __init__(self, specs: list[str], make: Callable[[str], Provider]) -> None:
        self.specs, self.make = list(dict.fromkeys(specs)), make  # a model edited to equal a fallback is tried once
        self.current = 0  # the model that answered last: the run keeps using it
        self._built: dict[str, Provider] = {}
        self.label = specs[0]

    def provider(self, spec: str) -> Provider:
        if spec not in self._built:
            self._built[spec] = self.make(spec)
        return self._built[spec]

    def complete(self, system: str, messages: list[dict], tools: list[dict], *, should_stop, on_event=None) -> Reply:
        from veronica.agent.providers.sdk import added, reason_of

        last: ProviderError | None = None
        spent = None  # what a failed model generated before it failed is billed: it rides on the reply
        for i in range(self.current, len(self.specs)):
            spec = self.specs[i]
            if last is not None and on_event is not None:
                on_event({"type": "fallback", "from": self.specs[i - 1], "to": spec, "reason": reason_of(last)})
            try:
                reply = self.provider(spec).complete(system, messages, tools, should_stop=should_stop, on_event=on_event)
            except ProviderError as exc:
                exc.model = spec
                if exc.permanent and i == 0:
                    raise  # the member's own model is misconfigured: not an outage
                if i == len(self.specs) - 1:
                    raise
                last = exc
                spent = added(spent, exc.usage) if exc.usage is not None else spent
                continue
            if spent is not None:
                reply.usage = added(reply.usage, spent)
            reply.model = spec
            self.current = i
            return reply
        raise last  # pragma: no cover - the loop always returns or raises
