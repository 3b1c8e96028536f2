"""Remote A2A agents as member tools, named `a2a__<remote>`: the call sends the message and waits,
up to the remote's timeout, for the remote task to finish (past it the remote task is cancelled).

Each call reaches outside the space, so it goes through the permission gate like a mutating MCP
tool, runs outside the run's transaction (network I/O never holds the fence's row locks), and is
recorded as an `a2a.called` event (remote, task id, state, seconds): the run trace and the run page
show it beside the tool.called / tool.result pair."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from veronica.agent.tools.base import S, Tool, ToolContext, ToolError, arg_str

if TYPE_CHECKING:
    from veronica.models import A2ARemote, Member

PREFIX = "a2a__"


@dataclass
class A2ATool(Tool):
    remote_name: str = ""


def _caller(remote_pk: int, name: str):
    def call(ctx: ToolContext, args: dict) -> str:
        from veronica import a2a_client, events
        from veronica.errors import VeronicaError
        from veronica.models import A2ARemote

        text = arg_str(args, "message", max_len=20000)
        remote = A2ARemote.objects.filter(pk=remote_pk).first()
        if remote is None:
            raise ToolError(f"the remote A2A agent '{name}' was removed")
        started = time.monotonic()
        try:
            if not remote.endpoint:  # declared by a manifest: the card is read at the first call
                card = a2a_client.fetch_card(remote.card_url, token=remote.token, timeout=min(remote.timeout, 30))
                A2ARemote.objects.filter(pk=remote.pk).update(endpoint=card.endpoint, description=card.description[:2000])
                remote.endpoint = card.endpoint
            outcome = a2a_client.call(remote.endpoint, remote.token, text, timeout=remote.timeout)
        except VeronicaError as exc:
            events.emit(ctx.space.pk, "a2a.called", member=ctx.member, remote=name, ok=False, error=str(exc)[:300],
                        seconds=round(time.monotonic() - started, 2))
            raise ToolError(f"A2A agent '{name}': {exc}") from None
        events.emit(ctx.space.pk, "a2a.called", member=ctx.member, remote=name, ok=True, task=outcome.task_id,
                    state=outcome.state, seconds=round(time.monotonic() - started, 2))
        if outcome.state != "completed":
            return f"the remote task ended {outcome.state}: {outcome.text}"
        return outcome.text
    return call


def tool_of(remote: "A2ARemote") -> A2ATool:
    about = (remote.description or "a remote agent")[:800]
    return A2ATool(f"{PREFIX}{remote.name}", f"[A2A {remote.name}] {about}. Sends it a message and returns its answer "
                   f"(waits up to {remote.timeout} s).", _caller(remote.pk, remote.name),
                   params={"message": {**S, "description": "what to ask the remote agent, in full"}}, required=("message",),
                   mutates=True, reaches_out=True, remote_name=remote.name)


def tools_of(member: "Member") -> list[Tool]:
    from veronica.models import A2ARemote

    return [tool_of(r) for r in A2ARemote.objects.filter(space_id=member.space_id).order_by("name")]
