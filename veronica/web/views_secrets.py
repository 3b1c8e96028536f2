"""The space's secrets page (owners): names, where they apply and when they changed; a value goes in
through a password field and is never shown again."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from veronica.swarm import access, secrets
from veronica.swarm.access import OWNER
from veronica.engine import supervisor
from veronica.plumbing.errors import VeronicaError
from veronica.web.views import _context, form_error, refuse_unstorable


def _action(request: HttpRequest, space) -> str:
    data, actor = request.POST, access.actor_name(request.user)
    who = data.get("member", "").strip()
    member = supervisor.get_member(space, who) if who else None
    where = f" for {member.name}" if member else " for the space"
    if data.get("action") == "set":
        secret = secrets.set_secret(space, data.get("name", "").strip(), data.get("value", ""), member=member,
                                    in_commands=data.get("in_commands") == "on", actor=actor)
        return f"saved secret {secret.name}{where}"
    if data.get("action") == "delete":
        secrets.delete_secret(space, data.get("name", ""), member=member, actor=actor)
        return f"deleted secret {data.get('name')}{where}"
    raise VeronicaError("action must be set or delete", field="action")


@login_required
@require_http_methods(["GET", "POST"])
def secrets_page(request: HttpRequest, slug: str) -> HttpResponse:
    space, role = access.space_for(request.user, slug, OWNER)
    status = 200
    if request.method == "POST":
        try:
            refuse_unstorable(request.POST)
            messages.success(request, _action(request, space))
            return redirect("console:secrets", slug=space.slug)
        except VeronicaError as exc:
            status = form_error(request, exc)
    return render(request, "console/secrets.html", _context(
        space, role, page="secrets", rows=secrets.listing(space), member_names=list(
            space.members.filter(removed_at__isnull=True).order_by("name").values_list("name", flat=True)),
        value_min=secrets.secret_store.MIN_VALUE, value_max=secrets.VALUE_MAX, name_max=secrets.NAME_MAX), status=status)
