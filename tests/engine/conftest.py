from __future__ import annotations

import pytest

from veronica.agent.providers.base import Reply, ToolCall, Usage


class ScriptedProvider:
    """Stands in for an LLM vendor: replays scripted replies, records what it was sent."""

    label = "scripted"

    def __init__(self, replies):
        self.replies = list(replies)
        self.systems: list[str] = []
        self.requests: list[list[dict]] = []
        self.on_call = None

    def complete(self, system, messages, tools, *, should_stop, on_event=None):
        self.systems.append(system)
        self.requests.append(messages)
        if self.on_call:
            self.on_call(len(self.systems))
        step = self.replies.pop(0) if self.replies else "done"
        if isinstance(step, Exception):  # a fault: ProviderError(permanent=..., usage=...)
            raise step
        if isinstance(step, Reply):  # a reply as the vendor sent it (empty, cut off, without usage)
            return step
        if isinstance(step, str):
            return Reply(text=step, usage=Usage(input=100, output=10))
        name, args = step
        return Reply(tool_calls=[ToolCall(id=f"c{len(self.systems)}", name=name, args=args)], usage=Usage(input=100, output=10))


@pytest.fixture
def scripted(monkeypatch):
    def install(*replies):
        provider = ScriptedProvider(replies)
        monkeypatch.setattr("veronica.agent.loop.get_provider", lambda spec: provider)
        return provider
    return install


@pytest.fixture
def rung(monkeypatch):
    """Wakes the tick and the verbs would enqueue, recorded instead of sent."""
    woken = []
    for target in ("veronica.engine.failures.enqueue_wake", "veronica.engine.tick.enqueue_wake",
                   "veronica.engine.wakes.enqueue_wake"):  # wakes.ring (the verbs, finish) calls the last
        monkeypatch.setattr(target, lambda pk, source: woken.append((pk, source)))
    return woken
