"""What people do to the store (admin, console): user rules, review decisions, reverts, toggles.

This module is the only writer of user rules. Passes (learning.passes) never import it except for
`approve_proposal` when a space allows auto-approve, and that touches learned rules only.

`scope` (every write that names a rule, proposal or change by id): the domains the caller may
touch. A host passes the domains of the tenant acting, so an id from another tenant's domain is
"not found", exactly like an id that does not exist. None (the admin, staff): every domain."""
from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from . import store
from .models import MAX_ACTIVE_RULES_PER_DOMAIN, ChangeAction, Domain, Proposal, ProposalStatus, Rule, RuleChange, RuleSource, people_write
from .ops import OpError, apply_ops, normalize_ops, same_rules, snapshot_diff
from .parsing import unstorable
from .store import RuleInputError, actor_name, as_domain, clean_rule_text, in_scope


class ReviewError(RuntimeError):
    """A decision that cannot be made (already decided, stale ops, gate, ...)."""


# --- user rules ---------------------------------------------------------------------------------

def _user_rule(rule_id, scope=None) -> Rule:
    try:
        return in_scope(Rule.objects.select_related("domain"), scope).get(pk=rule_id, source=RuleSource.USER)
    except (Rule.DoesNotExist, ValueError, TypeError):
        raise RuleInputError("rule", f"no user rule with id {rule_id!r}") from None


def add_user_rule(domain, text: str, *, actor, owner: str = "", _reverts: RuleChange | None = None) -> Rule:
    """`domain`: a Domain, or a reference resolved in `owner`'s namespace (created on first use)."""
    text, who = clean_rule_text(text), actor_name(actor)
    if not isinstance(domain, Domain):
        store.clean_ref(domain)  # a bad name is an input error before anything is written
    with people_write(), transaction.atomic():
        store.bump_stamp()
        domain = as_domain(domain, owner, actor=who)
        rule = Rule(domain=domain, source=RuleSource.USER, text=text, created_by=who, updated_by=who)
        rule.save()
        action = ChangeAction.REVERT if _reverts else ChangeAction.ADD
        store._record(domain, RuleSource.USER, action, who, [], store.snapshot([rule], with_domain=True), reverts=_reverts,
                      summary=f"added U{rule.pk}" if not _reverts else f"revert of change #{_reverts.pk}")
    return rule


def edit_user_rule(rule_id: int, text: str, *, actor, domain=None, owner: str = "", scope=None,
                   _reverts: RuleChange | None = None) -> Rule:
    """`domain` (optional) moves the rule: a Domain, or a reference in `owner`'s namespace; with a
    `scope`, the target must be in it too."""
    text, who = clean_rule_text(text), actor_name(actor)
    with people_write(), transaction.atomic():
        store.bump_stamp()
        rule = _user_rule(rule_id, scope)
        new_domain = as_domain(domain, owner, actor=who) if domain is not None else None
        if new_domain is not None and scope is not None and new_domain.pk not in {store.domain_id(d) for d in scope}:
            raise RuleInputError("domain", f"{new_domain.ref!r} is not one of your domains")
        before = store.snapshot([rule], with_domain=True)
        old_domain = rule.domain
        if rule.text == text and (new_domain is None or new_domain.pk == rule.domain_id):
            return rule
        rule.text = text
        if new_domain:
            rule.domain = new_domain
        rule.updated_by = who
        rule.save()
        action = ChangeAction.REVERT if _reverts else ChangeAction.EDIT
        summary = f"edited U{rule.pk}" + (f" (moved from {old_domain.label})" if rule.domain_id != old_domain.pk else "")
        store._record(rule.domain, RuleSource.USER, action, who, before, store.snapshot([rule], with_domain=True), reverts=_reverts,
                      summary=summary if not _reverts else f"revert of change #{_reverts.pk}")
    return rule


def remove_user_rule(rule_id: int, *, actor, scope=None, _reverts: RuleChange | None = None) -> None:
    who = actor_name(actor)
    with people_write(), transaction.atomic():
        store.bump_stamp()
        rule = _user_rule(rule_id, scope)
        before = store.snapshot([rule], with_domain=True)
        domain, pk = rule.domain_id, rule.pk
        rule.delete()
        action = ChangeAction.REVERT if _reverts else ChangeAction.REMOVE
        store._record(domain, RuleSource.USER, action, who, before, [], reverts=_reverts,
                      summary=f"removed U{pk}" if not _reverts else f"revert of change #{_reverts.pk}")


def set_learned_enabled(rule_id: int, enabled: bool, *, actor, scope=None, reason: str = "") -> RuleChange | None:
    reason = (reason or "").strip()
    if unstorable(reason):
        raise ReviewError(f"the reason {unstorable(reason)}")
    if len(reason) > REASON_MAX:
        raise ReviewError(f"the reason is {len(reason)} characters; the limit is {REASON_MAX}")
    return store.set_learned_enabled(rule_id, enabled, actor=actor_name(actor), scope=scope, reason=reason)


# --- review ---------------------------------------------------------------------------------------

def approve_proposal(proposal_id: int, *, actor, edited_ops=None, scope=None) -> RuleChange:
    """Apply a pending proposal (or the reviewer's edit of its ops) to the domain's learned rules,
    in one transaction. Raises ReviewError when it cannot be applied; then nothing changes."""
    who = actor_name(actor)
    try:
        ops = normalize_ops(edited_ops) if edited_ops is not None else None
    except OpError as exc:
        raise ReviewError(f"edited operations: {exc}") from None
    with transaction.atomic():
        store.bump_stamp()  # first: serializes rule writers (row lock on PostgreSQL)
        proposal = in_scope(Proposal.objects.select_for_update(), scope).filter(pk=proposal_id).first()
        if proposal is None:
            raise ReviewError(f"no proposal #{proposal_id}")
        if proposal.status != ProposalStatus.PENDING:
            raise ReviewError(f"proposal #{proposal.pk} is already {proposal.status}")
        if ops is not None and ops != proposal.ops:
            proposal.original_ops = proposal.ops
            proposal.ops = ops
        try:
            change = store.apply_ops(proposal.domain, proposal.ops, actor=who, proposal=proposal)
        except OpError as exc:
            raise ReviewError(f"proposal #{proposal.pk} cannot be applied: {exc}") from None
        proposal.status = ProposalStatus.APPROVED
        proposal.decided_by = who
        proposal.decided_at = timezone.now()
        proposal.save()
    return change


REASON_MAX = 250  # a disable's reason rides the change's 300-character summary


def reject_proposal(proposal_id: int, *, actor, reason: str = "", scope=None) -> Proposal:
    who = actor_name(actor)
    reason = (reason or "").strip()[:2000]
    if unstorable(reason):
        raise ReviewError(f"the reason {unstorable(reason)}")
    n = in_scope(Proposal.objects, scope).filter(pk=proposal_id, status=ProposalStatus.PENDING).update(
        status=ProposalStatus.REJECTED, decided_by=who, decided_at=timezone.now(), reason=reason
    )
    proposal = in_scope(Proposal.objects, scope).filter(pk=proposal_id).first()
    if proposal is None:
        raise ReviewError(f"no proposal #{proposal_id}")
    if not n:
        raise ReviewError(f"proposal #{proposal.pk} is already {proposal.status}")
    return proposal


def preview(proposal: Proposal) -> dict:
    """The proposal's diff against the CURRENT learned rules (what approving would do now)."""
    current = store.learned_snapshot(proposal.domain_id)
    stale = not _same_base(proposal.base, current)
    try:
        result = apply_ops(current, proposal.ops, max_active=MAX_ACTIVE_RULES_PER_DOMAIN)
        return {"diff": snapshot_diff(current, result), "stale": stale, "error": "",
                "active_after": sum(1 for r in result if r.get("enabled", True))}
    except OpError as exc:
        return {"diff": proposal.diff, "stale": stale, "error": str(exc), "active_after": None}


def _same_base(a, b) -> bool:
    return same_rules(a, b)


# --- history ------------------------------------------------------------------------------------

def revert_change(history_id: int, *, actor, scope=None) -> RuleChange:
    """Undo one recorded change. Refused when the rules it touched changed since (revert the later
    change first), so a revert never silently discards someone else's work."""
    who = actor_name(actor)
    entry = in_scope(RuleChange.objects.select_related("domain"), scope).filter(pk=history_id).first()
    if entry is None:
        raise ReviewError(f"no rule change #{history_id}")
    if entry.reverted_by.exists():
        raise ReviewError(f"change #{entry.pk} was already reverted")
    if entry.action == ChangeAction.SPLIT:
        raise ReviewError(f"change #{entry.pk} split a shared domain between its spaces; it is not reverted")
    if entry.source == RuleSource.LEARNED:
        try:
            return store.restore_learned(entry.domain, entry.after, entry.before, actor=who, reverts=entry)
        except OpError as exc:
            raise ReviewError(str(exc)) from None
    # a user rule: undo through the people write paths above
    before = entry.before[0] if entry.before else None
    after = entry.after[0] if entry.after else None
    with transaction.atomic():
        if after is not None:
            current = Rule.objects.filter(pk=after["id"], source=RuleSource.USER).first()
            if current is None or current.text != after["text"] or current.domain_id != after.get("domain_id", entry.domain_id):
                raise ReviewError(f"user rule U{after['id']} changed after change #{entry.pk}; revert the later change first")
        if before is None and after is not None:
            remove_user_rule(after["id"], actor=who, _reverts=entry)
        elif before is not None and after is None:
            add_user_rule(_domain_of(before, entry), before["text"], actor=who, _reverts=entry)
        elif before is not None and after is not None:
            edit_user_rule(after["id"], before["text"], actor=who, domain=_domain_of(before, entry), _reverts=entry)
        else:
            raise ReviewError(f"change #{entry.pk} has nothing to revert")
    return RuleChange.objects.filter(reverts=entry).latest("id")


def _domain_of(snapshot_item: dict, entry: RuleChange):
    """Where a user rule lived in a history snapshot (its domain id; the change's own domain when
    the snapshot predates ids)."""
    found = Domain.objects.filter(pk=snapshot_item.get("domain_id", entry.domain_id)).first()
    return found if found is not None else entry.domain
