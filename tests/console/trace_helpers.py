"""A real run through the engine with a scripted model: a retry, a failing tool, a good tool, a reply."""
from __future__ import annotations

import sys
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

from django.utils import timezone

from tests.engine.conftest import ScriptedProvider
from veronica.swarm import bus
from veronica.agent.mcp_client import manager
from veronica.engine import leases, runner, slot, supervisor
from veronica.engine.slot import RunLease
from veronica.models import McpServer, Member, Phase, Run


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
    monkeypatch.setattr("veronica.agent.metering.usd_for", lambda model, usage: Decimal("0.0012"))
    member = supervisor.get_member(space, name)
    bus.send(space, "boss", name, "look at the folder")
    runner.wake(member.pk, "message")
    return Run.objects.filter(member=member).latest("id")


MCP_SERVER = str(Path(__file__).resolve().parent.parent / "mcp_server.py")


def drive_mcp_run(monkeypatch, space, name: str = "w1") -> Run:
    """A run that calls a real MCP server's tool (tests/mcp_server.py, over stdio, unsandboxed)."""
    from django.conf import settings

    from veronica.swarm import mcp_servers

    monkeypatch.setattr(settings, "COMMAND_SANDBOX", "none")
    if not McpServer.objects.filter(space=space, name="calc").exists():
        mcp_servers.add(space, mcp_servers.check({"name": "calc", "command": [sys.executable, MCP_SERVER], "timeout": 20}),
                        actor="test")
    provider = ScriptedProvider((("mcp__calc__add", {"a": 2, "b": 40}), "The sum is 42."))
    monkeypatch.setattr("veronica.agent.loop.get_provider", lambda spec: provider)
    member = supervisor.get_member(space, name)
    bus.send(space, "boss", name, "add two numbers")
    try:
        runner.wake(member.pk, "message")
    finally:
        manager().close_all()
    return Run.objects.filter(member=member).latest("id")


def lease_lost_run(space, name: str = "w1") -> tuple[Run, RunLease]:
    """A run whose worker stalled mid model call: the watchdog expired its lease and ended it."""
    member = supervisor.get_member(space, name)
    lease = slot.claim(member, "message")
    slot.write_phase(lease.member, Phase.THINKING)
    Member.objects.filter(pk=member.pk).update(lease_expires_at=timezone.now() - timedelta(minutes=5))
    leases.expire_leases()
    return Run.objects.get(pk=lease.run.pk), lease
