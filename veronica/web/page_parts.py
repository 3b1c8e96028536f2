"""What every console page builds on: the template context, the member-or-404 lookup and the task forms'
choices. Moved out of web.views and web.views_cockpit so the pages that views includes (views_steer) and
the cockpit can use them without importing views back."""
from __future__ import annotations

from django.http import Http404

from veronica.engine import supervisor
from veronica.models import Member, Role, Space
from veronica.plumbing.errors import VeronicaError
from veronica.swarm.session_usage import with_session_usage
from veronica.swarm import access
from veronica.swarm.access import OPERATOR, OWNER


def _context(space: Space, role: str, **extra) -> dict:
    return {"space": space, "role": role, "can_steer": access.allows(role, OPERATOR), "can_manage": access.allows(role, OWNER),
            **extra}


def _member_or_404(space: Space, name: str, *, session_usage: bool = False):
    """session_usage: with its open session's token numbers (member_detail reads them again otherwise)."""
    try:
        return supervisor.get_member(space, name, among=with_session_usage(Member.objects.all()) if session_usage else None)
    except VeronicaError:
        raise Http404("no such member") from None


def task_controls(space: Space) -> dict:
    """What the task forms offer: live members and the roles a task can go to."""
    return {"assignees": list(Member.objects.filter(space=space, removed_at__isnull=True).order_by("role", "name")
                              .values_list("name", flat=True)), "roles": Role.values}
