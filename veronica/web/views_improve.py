"""Console pages for the two self-improvement loops of one space.

Rules: this space's own learning domains (a name routed here is this space's, even when another
space uses the same name) and the global domains its members route, which only staff change —
user rules (owners edit them; no pass can), learned rules with their strength, and proposals
waiting for review with their diff (operators approve or reject). Waggles: the space's library and the global one, with stats
(yields are estimates), steps, and enable / disable. Every write calls the app's own API.
"""
from __future__ import annotations

import logging

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from learning.api import LeaseLost, LockBusy, OpError, ReviewError, RuleInputError
from veronica.swarm import access, audit
from veronica.swarm.access import OPERATOR, OWNER
from veronica.plumbing.errors import VeronicaError
from veronica.swarm.learning_bridge import owner_key
from veronica.models import Member, Space
from veronica.web.views import _context, form_error, refuse_unstorable

log = logging.getLogger(__name__)
# learning's own refusals: their text is written for people and names the field and the limit
LEARNING_INPUT_ERRORS = (RuleInputError, OpError, ReviewError, LockBusy, LeaseLost)


def routed_domains(space: Space) -> list[str]:
    """The domain references this space's live members route (names, and global:<name>)."""
    domains = Member.objects.filter(space=space, removed_at__isnull=True).values_list("rule_domains", flat=True)
    return sorted({d for row in domains for d in row or ()})


def space_domains(space: Space) -> list[dict]:
    """What the rules page shows: this space's own domains (routed ones, even before their first
    rule, and owned ones no member routes any more) and the global domains its members route.
    Never another space's domain, whatever names its members carry."""
    from learning import api as learning

    key = owner_key(space)
    members = list(Member.objects.filter(space=space, removed_at__isnull=True).values_list("name", "rule_domains"))
    refs = routed_domains(space)
    found = {d.ref: d for d in learning.resolve(key, refs)}
    for d in learning.Domain.objects.filter(owner=key, is_global=False):
        found.setdefault(d.ref, d)
    rows = []
    for ref in sorted(set(refs) | set(found)):
        domain = found.get(ref)
        if domain is None and ref.startswith(learning.GLOBAL_PREFIX):
            continue  # staff removed that global domain; nothing to show or edit
        rows.append({"ref": ref, "domain": domain, "is_global": bool(domain and domain.is_global),
                     "members": [name for name, routed in members if ref in (routed or ())]})
    return rows


def _int(raw: str | None, field: str) -> int:
    try:
        return int(raw or "")
    except ValueError:
        raise VeronicaError(f"{field} must be a number", field=field) from None


def _rules_action(request: HttpRequest, space: Space, role: str) -> str:
    from learning import api as learning
    from learning.models import Proposal, Rule

    data, user = request.POST, request.user
    action = data.get("action", "")
    need = OWNER if action in ("add_rule", "edit_rule", "remove_rule") else OPERATOR
    if not access.allows(role, need):
        raise VeronicaError(f"{action} needs the {need} role in this space", field="action")
    rows = space_domains(space)
    scope = [r["domain"] for r in rows if r["domain"] is not None]  # every id below is looked up inside it

    def may_change(domain) -> None:
        if domain.is_global and not user.is_staff:
            raise VeronicaError(f"'{domain.ref}' is a global domain shared by every space that routes it; only staff "
                                "change it (in the admin)", field="domain")

    if action == "add_rule":
        ref = (data.get("domain") or "").strip().lower()
        row = next((r for r in rows if r["ref"] == ref), None)
        if row is None:
            shown = ", ".join(r["ref"] for r in rows) or "none"
            raise VeronicaError(f"domain '{ref}' is not one of this space's domains ({shown})", field="domain")
        if row["domain"] is not None:
            may_change(row["domain"])
        rule = learning.add_user_rule(row["domain"] or ref, data.get("text", ""), actor=user, owner=owner_key(space))
        audit.record("rule.add", space=space, target=rule.ref, after={"domain": row["ref"], "text": rule.text})
        return f"added user rule {rule.ref} to {row['ref']}"
    if action in ("edit_rule", "remove_rule", "toggle_learned"):
        rule = Rule.objects.filter(pk=_int(data.get("rule_id"), "rule_id"), domain__in=scope).select_related("domain").first()
        if rule is None:  # another space's rule reads exactly like one that does not exist
            raise VeronicaError("no such rule in this space", field="rule_id")
        may_change(rule.domain)
        if action == "edit_rule":
            learning.edit_user_rule(rule.pk, data.get("text", ""), actor=user, scope=scope)
            audit.record("rule.edit", space=space, target=rule.ref, before={"text": rule.text},
                         after={"text": Rule.objects.filter(pk=rule.pk).values_list("text", flat=True).first()})
            return f"edited {rule.ref}"
        if action == "remove_rule":
            learning.remove_user_rule(rule.pk, actor=user, scope=scope)
            audit.record("rule.remove", space=space, target=rule.ref, before={"text": rule.text})
            return f"removed {rule.ref}"
        if rule.source != "learned":
            raise VeronicaError(f"{rule.ref} is a user rule; only learned rules are enabled or disabled", field="rule_id")
        if rule.enabled and not data.get("reason", "").strip():  # a rejection says why (kept in the rule's history)
            raise VeronicaError(f"say why {rule.ref} is disabled: the reason is kept in its history", field="reason")
        learning.set_learned_enabled(rule.pk, not rule.enabled, actor=user, scope=scope, reason=data.get("reason", ""))
        audit.record("rule.enable" if not rule.enabled else "rule.disable", space=space, target=rule.ref,
                     before={"enabled": rule.enabled}, after={"enabled": not rule.enabled, "reason": data.get("reason", "")})
        return f"{'disabled' if rule.enabled else 'enabled'} {rule.ref}"
    if action in ("approve", "reject"):
        proposal = Proposal.objects.filter(pk=_int(data.get("proposal_id"), "proposal_id"), domain__in=scope).select_related(
            "domain").first()
        if proposal is None:
            raise VeronicaError("no such proposal in this space", field="proposal_id")
        may_change(proposal.domain)
        if action == "approve":
            learning.approve_proposal(proposal.pk, actor=user, scope=scope)
            audit.record("proposal.approve", space=space, target=f"proposal #{proposal.pk}", after={"domain": proposal.domain.ref})
            return f"approved proposal #{proposal.pk}; {proposal.domain.ref} rules updated"
        learning.reject_proposal(proposal.pk, actor=user, reason=data.get("reason", ""), scope=scope)
        audit.record("proposal.reject", space=space, target=f"proposal #{proposal.pk}",
                     after={"domain": proposal.domain.ref, "reason": data.get("reason", "")})
        return f"rejected proposal #{proposal.pk}"
    raise VeronicaError("unknown action", field="action")


@login_required
@require_http_methods(["GET", "POST"])
def rules_page(request: HttpRequest, slug: str) -> HttpResponse:
    from learning.models import Proposal, Rule

    space, role = access.space_for(request.user, slug)
    status = 200
    if request.method == "POST":
        try:
            refuse_unstorable(request.POST)
            messages.success(request, _rules_action(request, space, role))
            return redirect("console:rules", slug=space.slug)
        except VeronicaError as exc:
            status = form_error(request, exc)
        except LEARNING_INPUT_ERRORS as exc:  # learning's own messages (length, gate, stale proposal) name the field
            messages.error(request, str(exc))
            status = 400
        except Exception:  # never an internal's text (a database's or the ORM's) on the page
            log.exception("rules page: %s failed in space %s", request.POST.get("action", ""), space.slug)
            messages.error(request, f"action: {request.POST.get('action', '')[:40]} could not be done (an internal error, logged for the administrator)")
            status = 500
    rows = space_domains(space)
    ids = [r["domain"].pk for r in rows if r["domain"] is not None]
    rules = list(Rule.objects.filter(domain_id__in=ids).order_by("domain", "-source", "id"))
    proposals = list(Proposal.objects.filter(domain_id__in=ids, status="pending").order_by("id"))
    staff = request.user.is_staff
    by_domain = [{
        "name": r["ref"],
        "anchor": r["ref"].replace(":", "-"),
        "is_global": r["is_global"],
        "members": r["members"],
        "can_edit": access.allows(role, OWNER) and (staff or not r["is_global"]),
        "can_steer": access.allows(role, OPERATOR) and (staff or not r["is_global"]),
        "user": [x for x in rules if r["domain"] and x.domain_id == r["domain"].pk and x.source == "user"],
        "learned": [x for x in rules if r["domain"] and x.domain_id == r["domain"].pk and x.source == "learned"],
        "proposals": [p for p in proposals if r["domain"] and p.domain_id == r["domain"].pk],
    } for r in rows]
    return render(request, "console/rules.html", _context(space, role, domains=by_domain, page="rules",
                                                           can_edit_rules=access.allows(role, OWNER)), status=status)


@login_required
@require_http_methods(["GET", "POST"])
def waggles_page(request: HttpRequest, slug: str) -> HttpResponse:
    from waggle import service as waggle
    from waggle.models import LedgerEntry, Waggle

    space, role = access.space_for(request.user, slug)
    key, status = str(space.pk), 200
    if request.method == "POST":
        try:
            refuse_unstorable(request.POST)
            if not access.allows(role, OPERATOR):
                raise VeronicaError("enabling or disabling a waggle needs the operator role", field="action")
            name, scope = request.POST.get("name", ""), request.POST.get("scope", "")
            if scope == Waggle.SCOPE_GLOBAL and not request.user.is_staff:
                raise VeronicaError("global waggles are shared by every space; only staff change them", field="scope")
            target = Waggle.objects.filter(name=name, scope=scope, space_key=key if scope == Waggle.SCOPE_SPACE else "")
            disable = request.POST.get("action") == "disable"
            if not target.update(disabled=disable):
                raise VeronicaError(f"no waggle named '{name}' in this library", field="name")
            messages.success(request, f"{'disabled' if disable else 'enabled'} {name}")
            return redirect("console:waggles", slug=space.slug)
        except VeronicaError as exc:
            status = form_error(request, exc)
    library = waggle.list_waggles(key)
    scripts = {(w.scope, w.name): w.script for w in Waggle.objects.filter(space_key__in=[key, ""])}
    for row in library:
        row["script"] = scripts.get((row["scope"], row["name"]), "")
    ledger = LedgerEntry.objects.filter(space_key=key)[:50]
    saved = waggle.saved_tokens_per_day(key)
    return render(request, "console/waggles.html", _context(space, role, library=library, ledger=ledger, page="waggles",
                                                            saved=saved, saved_total=sum(t for _, t in saved)), status=status)


@login_required
@require_http_methods(["GET", "POST"])
def inbox_page(request: HttpRequest, slug: str) -> HttpResponse:
    """Mail the team sent the operator. Accepting (optionally after an edit) files it; an edit is
    a lesson the learning app's outbox ledger mines."""
    from veronica.swarm import bus
    from veronica.models import Message

    space, role = access.space_for(request.user, slug)
    status = 200
    if request.method == "POST":
        try:
            refuse_unstorable(request.POST)
            if not access.allows(role, OPERATOR):
                raise VeronicaError("accepting mail needs the operator role", field="action")
            message = Message.objects.filter(space=space, pk=_int(request.POST.get("message_id"), "message_id")).first()
            if message is None:
                raise VeronicaError("no such message in this space", field="message_id")
            accepted = bus.accept_operator_mail(message, user=request.user, body=request.POST.get("body"))
            messages.success(request, f"accepted #{accepted.pk}{' with your edit' if accepted.accepted_body else ''}")
            return redirect("console:inbox", slug=space.slug)
        except VeronicaError as exc:
            status = form_error(request, exc)
    mail = Message.objects.filter(space=space, recipient_name=bus.OPERATOR).order_by("-id")[:100]
    return render(request, "console/inbox.html", _context(space, role, mail=mail, page="inbox"), status=status)
