"""Operator decisions on held tool calls and questions. A decision wakes the member (resume)."""
from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from veronica import events
from veronica.engine.wakes import wake_on_commit
from veronica.errors import Conflict, NotFound, require_text
from veronica.models import Approval, ApprovalStatus, Question, Space


def get_approval(space: Space, approval_id: int) -> Approval:
    approval = Approval.objects.filter(space=space, pk=approval_id).select_related("member").first()
    if approval is None:
        raise NotFound(f"no approval #{approval_id} in this space", field="approval_id")
    return approval


def decide(approval: Approval, *, approve: bool, user, reason: str = "") -> Approval:
    """Approve or deny once. A denial's reason goes back to the model (and to the learning app)."""
    reason = require_text(reason, "reason", max_len=2000, allow_empty=True).strip()
    status = ApprovalStatus.APPROVED if approve else ApprovalStatus.DENIED
    with transaction.atomic():
        changed = Approval.objects.filter(pk=approval.pk, status=ApprovalStatus.PENDING).update(
            status=status, reason=reason, decided_by=user, decided_at=timezone.now())
        if not changed:
            raise Conflict(f"approval #{approval.pk} was already decided", field="approval_id")
        events.emit(approval.space_id, "approval.decided", member=approval.member, approval=approval.pk, tool=approval.tool_name,
                    status=status, reason=reason, by=getattr(user, "username", str(user)))
        wake_on_commit([approval.member_id], "resume")
    approval.refresh_from_db()
    return approval


def answer(question: Question, *, text: str, user) -> Question:
    text = require_text(text, "answer", max_len=10000)
    with transaction.atomic():
        if not Question.objects.filter(pk=question.pk, answered_at__isnull=True).update(answer=text, answered_by=user, answered_at=timezone.now()):
            raise Conflict(f"question #{question.pk} was already answered", field="question_id")
        events.emit(question.space_id, "question.answered", member=question.member, question=question.pk,
                    by=getattr(user, "username", str(user)))
        wake_on_commit([question.member_id], "resume")
    question.refresh_from_db()
    return question
