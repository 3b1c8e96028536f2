"""The audit pages: a space's trail for its owners, every space's for staff; filterable, and
exportable as JSON lines (streamed, so a year of rows never sits in memory)."""
from __future__ import annotations

import json
from datetime import datetime, time, timedelta

from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from veronica.swarm import access, audit
from veronica.swarm.access import OWNER
from veronica.swarm.audit import Via
from veronica.plumbing.errors import VeronicaError, text_problem
from veronica.models import AuditRow

PAGE_ROWS = 200
FILTER_MAX = 160  # the actor column's width; no filter needs more
VIA_CHOICES = (Via.SESSION, Via.TOKEN, Via.ADMIN, Via.COMMAND)
STAFF_PERMISSION = "veronica.view_auditrow"


def may_see_all(user) -> bool:
    """The staff page: superusers, and staff given the audit row's view permission."""
    return user.is_active and user.is_staff and (user.is_superuser or user.has_perm(STAFF_PERMISSION))


def _day(raw: str, field: str, *, end: bool) -> datetime:
    try:
        day = datetime.strptime(raw, "%Y-%m-%d").date()
    except ValueError:
        raise VeronicaError(f"{field} must be a date as YYYY-MM-DD", field=field) from None
    moment = datetime.combine(day + timedelta(days=1) if end else day, time.min)
    return timezone.make_aware(moment, timezone.get_current_timezone())


def filtered(rows: QuerySet, params) -> tuple[QuerySet, dict]:
    """The page's filters: actor and target (contains), action (prefix), via, since and until (days,
    both included), space (staff page). Bad values are a 400 naming the field."""
    given = {}
    for name in ("actor", "action", "target", "via", "since", "until", "space"):
        value = (params.get(name) or "").strip()
        if text_problem(value) or len(value) > FILTER_MAX:
            raise VeronicaError(f"{name} must be text of at most {FILTER_MAX} characters", field=name)
        given[name] = value
    if given["via"] and given["via"] not in VIA_CHOICES:
        raise VeronicaError(f"via must be one of {', '.join(VIA_CHOICES)}", field="via")
    if given["actor"]:
        rows = rows.filter(actor__icontains=given["actor"])
    if given["target"]:
        rows = rows.filter(target__icontains=given["target"])
    if given["action"]:
        rows = rows.filter(action__startswith=given["action"])
    if given["via"]:
        rows = rows.filter(via=given["via"])
    if given["space"]:
        rows = rows.filter(space_slug=given["space"])
    if given["since"]:
        rows = rows.filter(created_at__gte=_day(given["since"], "since", end=False))
    if given["until"]:
        rows = rows.filter(created_at__lt=_day(given["until"], "until", end=True))
    return rows, given


def _jsonl(rows: QuerySet):
    for row in rows.order_by("created_at", "id").iterator(chunk_size=500):
        yield json.dumps(row.as_wire(), ensure_ascii=False) + "\n"


def _answer(request: HttpRequest, rows: QuerySet, context: dict, filename: str) -> HttpResponse:
    try:
        rows, given = filtered(rows, request.GET)
    except VeronicaError as exc:
        return render(request, "console/audit.html", {**context, "error": f"{exc.field}: {exc.message}", "rows": [],
                                                       "filters": {}, "via_choices": VIA_CHOICES}, status=400)
    if request.GET.get("format") == "jsonl":
        response = StreamingHttpResponse(_jsonl(rows), content_type="application/x-ndjson; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="{filename}"'
        return response
    shown = list(rows[:PAGE_ROWS + 1])
    query = request.GET.copy()
    query["format"] = "jsonl"
    return render(request, "console/audit.html", {
        **context, "rows": [{**row.as_wire(), "before_json": _pretty(row.before), "after_json": _pretty(row.after)}
                            for row in shown[:PAGE_ROWS]],
        "more": len(shown) > PAGE_ROWS, "page_rows": PAGE_ROWS, "filters": given, "filtering": any(given.values()),
        "via_choices": VIA_CHOICES,
        "export_query": query.urlencode()})


def _pretty(value) -> str:
    return "" if value is None else json.dumps(value, indent=1, sort_keys=True, ensure_ascii=False)


@login_required
@require_GET
def space_audit(request: HttpRequest, slug: str) -> HttpResponse:
    """Owners only: a viewer or operator gets 403, someone who cannot see the space 404."""
    space, role = access.space_for(request.user, slug, OWNER)
    return _answer(request, AuditRow.objects.filter(space=space), {"space": space, "role": role, "page": "audit"},
                   f"audit-{space.slug}.jsonl")


@login_required
@require_GET
def staff_audit(request: HttpRequest) -> HttpResponse:
    if not may_see_all(request.user):
        raise PermissionDenied("the audit of every space is for staff with the audit permission")
    return _answer(request, AuditRow.objects.all(), {"space": None, "page": "audit"}, "audit.jsonl")


class PasswordChange(auth_views.PasswordChangeView):
    """Django's password change, with its audit row (the password itself never is in it)."""

    def form_valid(self, form):
        response = super().form_valid(form)
        audit.record("password.change", target=self.request.user.get_username())
        return response
