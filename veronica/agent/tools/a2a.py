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
from veronica.agent.tools.swarm import WaitForOperator
from veronica.swarm.a2a_calls import ended_text

if TYPE_CHECKING:
    from veronica.models import A2ARemote, Member

PREFIX = "a2a__"


@dataclass
class A2ATool(Tool):
    remote_name: str = ""


class WaitForRemote(WaitForOperator):
    """The remote task outlived the inline wait: the run parks until the tick sees it end."""


def _park(ctx: ToolContext, args: dict, remote, outcome, started: float) -> None:
    from datetime import timedelta

    from veronica.swarm import events
    from veronica.engine import clock
    from veronica.models import A2ACall

    now = clock.now()  # the database's clock, as the tick that polls it reads
    call = A2ACall.objects.create(space=ctx.space, member=ctx.member, tool_call_id=str(args.get("_call_id", "")), remote=remote,
                                  remote_name=remote.name, remote_task_id=outcome.task_id, next_poll_at=now,
                                  deadline=now + timedelta(seconds=max(remote.timeout - (time.monotonic() - started), 1)))
    events.emit(ctx.space.pk, "a2a.parked", member=ctx.member, remote=remote.name, task=outcome.task_id, call=call.pk)
    raise WaitForRemote(call.pk)


def held(member: "Member", call_id: str):
    """For resolve_held: the parked call this id names (unconsumed), or None."""
    from veronica.models import A2ACall

    return A2ACall.objects.filter(member=member, tool_call_id=call_id, consumed=False).first()


def consume(parked) -> str:
    """Inside the fence that persists the call's result: the parked call is used up."""
    from veronica.models import A2ACall

    A2ACall.objects.filter(pk=parked.pk).update(consumed=True)
    return parked.result


def _caller(remote_pk: int, name: str):
    def call(ctx: ToolContext, args: dict) -> str:
        from django.conf import settings

        from veronica.swarm import a2a_client, a2a_settings, events
        from veronica.plumbing.errors import VeronicaError
        from veronica.models import A2ARemote

        text = arg_str(args, "message", max_len=20000)
        remote = A2ARemote.objects.filter(pk=remote_pk).first()
        if remote is None:
            raise ToolError(f"the remote A2A agent '{name}' was removed")
        started = time.monotonic()
        try:
            token = a2a_settings.bearer(remote, ctx.member)
            if not remote.endpoint:  # declared by a manifest: the card is read at the first call
                card = a2a_client.fetch_card(remote.card_url, token=token, timeout=min(remote.timeout, 30))
                A2ARemote.objects.filter(pk=remote.pk).update(endpoint=card.endpoint, description=card.description[:2000])
                remote.endpoint = card.endpoint
            # parking needs the call's id (a run's call always has one; a direct call waits inline)
            inline = settings.A2A_INLINE_SECONDS if args.get("_call_id") else None
            outcome = a2a_client.call(remote.endpoint, token, text, timeout=remote.timeout, inline=inline)
        except VeronicaError as exc:
            events.emit(ctx.space.pk, "a2a.called", member=ctx.member, remote=name, ok=False, error=str(exc)[:300],
                        seconds=round(time.monotonic() - started, 2))
            raise ToolError(f"A2A agent '{name}': {exc}") from None
        if outcome.parked:
            _park(ctx, args, remote, outcome, started)
        events.emit(ctx.space.pk, "a2a.called", member=ctx.member, remote=name, ok=True, task=outcome.task_id,
                    state=outcome.state, seconds=round(time.monotonic() - started, 2))
        return ended_text(outcome.state, outcome.text)
    return call


def tool_of(remote: "A2ARemote") -> A2ATool:
    about = (remote.description or "a remote agent")[:800]
    return A2ATool(f"{PREFIX}{remote.name}", f"[A2A {remote.name}] {about}. Sends it a message and returns its answer "
                   f"(waits up to {remote.timeout} s).", _caller(remote.pk, remote.name),
                   params={"message": {**S, "description": "what to ask the remote agent, in full"}}, required=("message",),
                   mutates=True, reaches_out=True, remote_name=remote.name)


def tools_of(member: "Member") -> list[Tool]:
    from veronica.models import A2ARemote

    from veronica.plumbing.compiled_select import fetch

    return [tool_of(r) for r in fetch(("a2a-remotes-of",), lambda s: A2ARemote.objects.filter(space_id=s.int("space")).order_by("name"),
                                      {"space": member.space_id})]  # compiled once: read every run
