"""Operator decisions on held tool calls and questions. A decision wakes the member (resume)."""
from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from veronica.swarm import audit, events
from veronica.engine.wakes import wake_on_commit
from veronica.plumbing.errors import Conflict, NotFound, VeronicaError, require_text
from veronica.models import Approval, ApprovalRule, ApprovalStatus, Member, Question, Space


def get_approval(space: Space, approval_id: int) -> Approval:
    approval = Approval.objects.filter(space=space, pk=approval_id).select_related("member").first()
    if approval is None:
        raise NotFound(f"no approval #{approval_id} in this space", field="approval_id")
    return approval


@audit.verb("approval.decide", watch="approval")
def decide(approval: Approval, *, approve: bool, user, reason: str = "", always: bool = False) -> Approval:
    """Approve or deny once; or approve and always allow this tool for this member (a rule the
    gate consults from the next call on). A denial's reason goes back to the model (and to the learning app)."""
    reason = require_text(reason, "reason", max_len=2000, allow_empty=True).strip()
    if not isinstance(always, bool):
        raise VeronicaError("always must be true or false", field="always")
    if always and not approve:
        raise VeronicaError("always applies to an approval, not a denial", field="always")
    status = ApprovalStatus.APPROVED if approve else ApprovalStatus.DENIED
    with transaction.atomic():
        changed = Approval.objects.filter(pk=approval.pk, status=ApprovalStatus.PENDING).update(
            status=status, reason=reason, decided_by=user, decided_at=timezone.now())
        if not changed:
            raise Conflict(f"approval #{approval.pk} was already decided", field="approval_id")
        events.emit(approval.space_id, "approval.decided", member=approval.member, approval=approval.pk, tool=approval.tool_name,
                    status=status, reason=reason, by=getattr(user, "username", str(user)), always=always)
        if always:
            allow_always(approval.member, approval.tool_name, user=user, approval=approval)
        wake_on_commit([approval.member_id], "resume")
    approval.refresh_from_db()
    return approval


# --- "always for this tool on this member" ------------------------------------------------------------

def always_allowed(member: Member, tool_name: str) -> bool:
    """The permission gate's question (read per held call, so a revoke holds the very next one)."""
    return ApprovalRule.objects.filter(member_id=member.pk, tool_name=tool_name, revoked_at__isnull=True).exists()


@audit.verb("approval_rule.add", created=True)
def allow_always(member: Member, tool_name: str, *, user, approval: Approval | None = None) -> ApprovalRule:
    """A standing approval; an existing live rule for the same tool is kept (nothing new is written)."""
    tool_name = require_text(tool_name, "tool", max_len=64)
    with transaction.atomic():
        rule = ApprovalRule.objects.filter(member=member, tool_name=tool_name, revoked_at__isnull=True).first()
        if rule is not None:
            return rule
        rule = ApprovalRule.objects.create(space_id=member.space_id, member=member, tool_name=tool_name, created_by=user,
                                           from_approval=approval)
        events.emit(member.space_id, "approval.rule_added", member=member, rule=rule.pk, tool=tool_name,
                    by=getattr(user, "username", str(user)), approval=approval.pk if approval else None)
    return rule


def get_rule(space: Space, rule_id: int) -> ApprovalRule:
    rule = ApprovalRule.objects.filter(space=space, pk=rule_id).select_related("member").first()
    if rule is None:
        raise NotFound(f"no approval rule #{rule_id} in this space", field="rule_id")
    return rule


@audit.verb("approval_rule.revoke", watch="rule")
def revoke_rule(rule: ApprovalRule, *, user) -> ApprovalRule:
    with transaction.atomic():
        if not ApprovalRule.objects.filter(pk=rule.pk, revoked_at__isnull=True).update(revoked_at=timezone.now(), revoked_by=user):
            raise Conflict(f"approval rule #{rule.pk} is already revoked", field="rule_id")
        events.emit(rule.space_id, "approval.rule_revoked", member=rule.member, rule=rule.pk, tool=rule.tool_name,
                    by=getattr(user, "username", str(user)))
    rule.refresh_from_db()
    return rule


# what rule_row reads (the joined member and user rows whole cost more to compile and decode than the rule)
RULE_READ = ("id", "tool_name", "created_at", "from_approval_id", "revoked_at", "member__name", "created_by__username",
             "revoked_by__username")


def rules_of(space: Space, *, member: Member | None = None, live_only: bool = True) -> list[dict]:
    qs = ApprovalRule.objects.filter(space=space).select_related("member", "created_by", "revoked_by").only(*RULE_READ)
    if member is not None:
        qs = qs.filter(member=member)
    if live_only:
        qs = qs.filter(revoked_at__isnull=True)
    return [rule_row(r) for r in qs.order_by("member__name", "tool_name", "-id")]


def rule_row(rule: ApprovalRule) -> dict:
    def who(user) -> str | None:
        return user.get_username() if user is not None else None
    return {"id": rule.pk, "member": rule.member.name, "tool": rule.tool_name, "created_by": who(rule.created_by),
            "created_at": rule.created_at.isoformat(), "approval": rule.from_approval_id,
            "revoked_at": rule.revoked_at.isoformat() if rule.revoked_at else None, "revoked_by": who(rule.revoked_by)}


@audit.verb("question.answer", watch="question")
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
