"""A real run through the engine with a scripted model: a retry, a failing tool, a good tool, a reply."""
from __future__ import annotations

from decimal import Decimal

from tests.engine.conftest import ScriptedProvider
from veronica import bus
from veronica.engine import runner, supervisor
from veronica.models import Run


class RetryingProvider(ScriptedProvider):
    """The first call streams a little, is retried once (HTTP 529), then answers as scripted."""

    def complete(self, system, messages, tools, *, should_stop, on_event=None):
        if on_event is not None and not self.systems:
            on_event({"type": "text", "delta": "Let me look"})
            on_event({"type": "retry", "delay": 0.0, "reason": "HTTP 529 overloaded"})
        return super().complete(system, messages, tools, should_stop=should_stop, on_event=on_event)


SCRIPT = (("read_file", {"path": "missing.txt"}), ("list_dir", {}), "All done: the folder is empty.")


def drive_run(monkeypatch, space, name: str = "w1") -> Run:
    provider = RetryingProvider(SCRIPT)
    monkeypatch.setattr("veronica.agent.loop.get_provider", lambda spec: provider)
    monkeypatch.setattr("veronica.agent.loop.usd_for", lambda model, usage: Decimal("0.0012"))
    member = supervisor.get_member(space, name)
    bus.send(space, "boss", name, "look at the folder")
    runner.wake(member.pk, "message")
    return Run.objects.filter(member=member).latest("id")
