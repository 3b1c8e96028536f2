"""Console parts of the operator's cockpit (issue 22): the member's chat and budget panels, the
prompt inspector. Writes go through the JSON API (veronica.api.steer), which calls the verbs."""
from __future__ import annotations

from typing import Callable

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from veronica.swarm import access, chat
from veronica.api import selectors as sel
from veronica.engine import approvals, budget
from veronica.plumbing.errors import VeronicaError
from veronica.web.page_parts import _context, _member_or_404


def member_panels(member: Callable, usage: Callable) -> dict[str, Callable[[], dict]]:
    """Extra member panels; `member` fetches the member (each refresh reads it fresh), `usage` its usage row today."""
    return {
        "chat": lambda: {"chat": chat.conversation(member(), limit=30)},
        "budget": lambda: {"budget": budget.budget_state(member(), usage())},
        "approval_rules": lambda: {"approval_rules": approvals.rules_of(member().space, member=member())},
    }


def approval_rules(space) -> list[dict]:
    return approvals.rules_of(space)


@login_required
def prompt_page(request: HttpRequest, slug: str, name: str) -> HttpResponse:
    """The prompt inspector: the next model call, or ?call=<assistant turn id> for a past one."""
    from veronica.web import prompt_inspector

    space, role = access.space_for(request.user, slug)
    member = _member_or_404(space, name)
    try:
        call = sel.int_param(request.GET, "call", None, minimum=1, maximum=2**63 - 1)
        shown = prompt_inspector.next_call(member) if call is None else prompt_inspector.past_call(member, call)
    except VeronicaError as exc:
        raise Http404(exc.message) from None
    return render(request, "console/prompt.html", _context(space, role, member_name=member.name, page="prompt", shown=shown))
