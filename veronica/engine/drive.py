"""Drive a space in-process until it is quiet: the headless demo and the engine unit tests use it.
It calls the same wake task the cluster runs; it only replaces the broker with a loop."""
from __future__ import annotations

import time
from typing import Callable

from django.db.models import Exists, OuterRef

from veronica.engine import runner
from veronica.models import A2ACall, Approval, ApprovalStatus, Member, Membership, Message, Question, RunStatus, Space


def members_with_work(space: Space) -> list[Member]:
    unread = Message.objects.filter(recipient=OuterRef("pk"), read_at__isnull=True)
    decided = Approval.objects.filter(member=OuterRef("pk"), consumed=False).exclude(status=ApprovalStatus.PENDING)
    answered = Question.objects.filter(member=OuterRef("pk"), consumed=False, answered_at__isnull=False)
    remote_done = A2ACall.objects.filter(member=OuterRef("pk"), consumed=False, finished_at__isnull=False)
    return list(Member.objects.filter(space=space, membership=Membership.ACTIVE, removed_at__isnull=True, run_status=RunStatus.IDLE)
                .filter(Exists(unread) | Exists(decided) | Exists(answered) | Exists(remote_done)).order_by("id"))


def run_until_quiet(space: Space, *, max_wakes: int = 500, timeout: float = 60.0,
                    on_wake: Callable[[Member, str], None] | None = None) -> int:
    wakes, deadline = 0, time.monotonic() + timeout
    while wakes < max_wakes and time.monotonic() < deadline:
        ready = members_with_work(space)
        if not ready:
            return wakes
        for member in ready:
            source = "message" if runner.has_unread(member.pk) else "resume"
            outcome = runner.wake(member.pk, source)
            wakes += 1
            if on_wake:
                on_wake(member, outcome)
    return wakes
