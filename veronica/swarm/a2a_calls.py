"""Parked a2a__ calls, polled by the engine tick: a remote task that ended (or whose timeout passed:
it is cancelled there) finishes its call with the text the model reads, and wakes the member
(`resume`), whose next run takes it as the call's result. No worker waits meanwhile."""
from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction

from veronica.swarm import a2a_client, a2a_settings, events
from veronica.engine import clock
from veronica.engine.wakes import wake_on_commit
from veronica.plumbing.errors import VeronicaError, storable
from veronica.models import A2ACall

log = logging.getLogger(__name__)
POLL_EVERY = timedelta(seconds=2)
MAX_PER_TICK = 20  # each poll is one short request; the rest wait for the next tick


def ended_text(state: str, text: str) -> str:
    """What the a2a__ tool call reads when the remote task ends: its answer, or how it ended."""
    return text if state == "completed" else f"the remote task ended {state}: {text}"


def _finish(call: A2ACall, state: str, text: str) -> None:
    with transaction.atomic():
        done = A2ACall.objects.filter(pk=call.pk, finished_at__isnull=True).update(
            finished_at=clock.now(), state=state[:20], result=storable(ended_text(state, text))[:20000])
        if done:
            events.emit(call.space_id, "a2a.called", member=call.member, remote=call.remote_name, ok=state == "completed",
                        task=call.remote_task_id, state=state, parked=True)
            wake_on_commit([call.member_id], "resume")


def poll_parked() -> int:
    """One tasks/get per due call; the number finished."""
    now, finished = clock.now(), 0
    due = A2ACall.objects.filter(finished_at__isnull=True, next_poll_at__lte=now).select_related("remote", "member")
    for call in due.order_by("next_poll_at")[:MAX_PER_TICK]:
        A2ACall.objects.filter(pk=call.pk).update(next_poll_at=now + POLL_EVERY)
        remote = call.remote
        if remote is None or not remote.endpoint:
            _finish(call, "failed", f"error: the remote agent '{call.remote_name}' was removed while its task ran")
            finished += 1
            continue
        token = ""  # a secret gone since the call started: the poll fails (logged) and the deadline ends it
        try:
            token = a2a_settings.bearer(remote, call.member)
            task = a2a_client.get_task(remote.endpoint, token, call.remote_task_id, timeout=10)
        except VeronicaError as exc:
            log.warning("a2a poll of %s/%s failed: %s", call.remote_name, call.remote_task_id, exc)
            task = None
        if task is not None and a2a_client.ended(task):
            _finish(call, task.status.state.value, a2a_client.answer_text(task))
            finished += 1
        elif now >= call.deadline:
            a2a_client.cancel_quietly(remote.endpoint, token, call.remote_task_id)
            _finish(call, "failed", f"error: the remote task {call.remote_task_id} did not finish within {remote.timeout} s (cancelled)")
            finished += 1
    return finished
