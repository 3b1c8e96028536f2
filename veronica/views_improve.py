"""Console pages for the two self-improvement loops of one space.

Rules: the learning domains routed to this space's members — user rules (owners edit them; no
pass can), learned rules with their strength, and proposals waiting for review with their diff
(operators approve or reject). Waggles: the space's library and the global one, with stats
(yields are estimates), steps, and enable / disable. Every write calls the app's own API.
"""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from veronica import access
from veronica.access import OPERATOR, OWNER
from veronica.errors import VeronicaError
from veronica.models import Member, Space
from veronica.views import _context, form_error, refuse_unstorable


def routed_domains(space: Space) -> list[str]:
    domains = Member.objects.filter(space=space, removed_at__isnull=True).values_list("rule_domains", flat=True)
    return sorted({d for row in domains for d in row})


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
    domains = routed_domains(space)
    need = OWNER if action in ("add_rule", "edit_rule", "remove_rule") else OPERATOR
    if not access.allows(role, need):
        raise VeronicaError(f"{action} needs the {need} role in this space", field="action")

    def own_domain(domain: str) -> str:
        if domain not in domains:
            raise VeronicaError(f"domain '{domain}' is not routed to any member of this space ({', '.join(domains) or 'none'})",
                                field="domain")
        return domain

    if action == "add_rule":
        rule = learning.add_user_rule(own_domain(data.get("domain", "")), data.get("text", ""), actor=user)
        return f"added user rule {rule.ref} to {rule.domain}"
    if action in ("edit_rule", "remove_rule", "toggle_learned"):
        rule = Rule.objects.filter(pk=_int(data.get("rule_id"), "rule_id")).first()
        if rule is None:
            raise VeronicaError("no such rule", field="rule_id")
        own_domain(rule.domain)
        if action == "edit_rule":
            learning.edit_user_rule(rule.pk, data.get("text", ""), actor=user)
            return f"edited {rule.ref}"
        if action == "remove_rule":
            learning.remove_user_rule(rule.pk, actor=user)
            return f"removed {rule.ref}"
        learning.set_learned_enabled(rule.pk, not rule.enabled, actor=user)
        return f"{'disabled' if rule.enabled else 'enabled'} {rule.ref}"
    if action in ("approve", "reject"):
        proposal = Proposal.objects.filter(pk=_int(data.get("proposal_id"), "proposal_id")).first()
        if proposal is None:
            raise VeronicaError("no such proposal", field="proposal_id")
        own_domain(proposal.domain)
        if action == "approve":
            learning.approve_proposal(proposal.pk, actor=user)
            return f"approved proposal #{proposal.pk}; {proposal.domain} rules updated"
        learning.reject_proposal(proposal.pk, actor=user, reason=data.get("reason", ""))
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
        except Exception as exc:  # learning's own input errors (length, gate, stale proposal) read as text
            messages.error(request, str(exc))
            status = 400
    domains = routed_domains(space)
    rules = list(Rule.objects.filter(domain__in=domains).order_by("domain", "-source", "id"))
    proposals = list(Proposal.objects.filter(domain__in=domains, status="pending").order_by("id"))
    by_domain = [{
        "name": d,
        "members": [m.name for m in Member.objects.filter(space=space, removed_at__isnull=True) if d in m.rule_domains],
        "user": [r for r in rules if r.domain == d and r.source == "user"],
        "learned": [r for r in rules if r.domain == d and r.source == "learned"],
        "proposals": [p for p in proposals if p.domain == d],
    } for d in domains]
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
    from veronica import bus
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
