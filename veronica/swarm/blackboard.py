"""The blackboard: one bounded document per space, replaced whole (a retried write converges)."""
from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from veronica.swarm import audit, events
from veronica.plumbing.compiled_select import fetch
from veronica.plumbing.errors import VeronicaError, text_problem
from veronica.models import Blackboard, Space

# A space's cap on the board's size, in characters: the minimum is the database's CHECK
# (space_blackboard_cap_min); the maximum keeps every wake brief within a model's context.
CAP_MIN, CAP_MAX = 100, 1_000_000


def clean_cap(value: object, field: str = "blackboard_cap") -> int:
    """The one check of a blackboard cap (admin, manifest, any settings form): an integer within
    CAP_MIN..CAP_MAX, or an error naming the field and the limits."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise VeronicaError(f"{field} must be an integer between {CAP_MIN} and {CAP_MAX}", field=field)
    if not CAP_MIN <= value <= CAP_MAX:
        raise VeronicaError(f"{field} is {value}; it must be between {CAP_MIN} and {CAP_MAX} characters", field=field)
    return value


@audit.verb("space.blackboard_cap", watch="space")
def set_cap(space: Space, cap: object, *, actor: str) -> Space:
    """Change the space's blackboard cap (the read side cuts a board written under a larger one)."""
    cap = clean_cap(cap)
    with transaction.atomic():
        Space.objects.filter(pk=space.pk).update(blackboard_cap=cap)
        events.emit(space.pk, "space.blackboard_cap", cap=cap, actor=actor)
    space.blackboard_cap = cap
    return space


def read(space: Space) -> Blackboard:
    found = fetch(("blackboard-of",), lambda s: Blackboard.objects.filter(space_id=s.int("space")), {"space": space.pk})
    if found:  # every wake brief reads it: compiled once; get_or_create only for a space without one yet
        return found[0]
    board, _ = Blackboard.objects.get_or_create(space=space)
    return board


def for_members(space: Space) -> tuple[Blackboard, str]:
    """The board as a member reads it (wake brief, blackboard_read): cut at the space's cap as it is
    now. The write side bounds new boards; a board written under a larger cap, before the cap was
    lowered, would otherwise ride whole into every member's every wake."""
    board = read(space)
    cap = space.blackboard_cap
    if len(board.content) <= cap:
        return board, board.content
    return board, (board.content[:cap] + f"\n[blackboard truncated: {len(board.content)} characters, the cap is {cap}; "
                   f"the last {len(board.content) - cap} are not shown. Rewrite it within the cap.]")


@audit.verb("blackboard.write")
def write(space: Space, writer: str, content: str) -> Blackboard:
    """Replace the board. Oversize content fails naming the cap and the overage; empty clears it."""
    if not isinstance(content, str):
        raise VeronicaError("content must be a string", field="content")
    if text_problem(content):
        raise VeronicaError(f"content {text_problem(content)}", field="content")
    cap = space.blackboard_cap
    if len(content) > cap:
        raise VeronicaError(f"blackboard content is {len(content)} characters; the cap is {cap} "
                            f"({len(content) - cap} over). Shorten it and write the whole document again.", field="content")
    cleared = not content.strip()
    with transaction.atomic():
        board, _ = Blackboard.objects.select_for_update().get_or_create(space=space)
        board.content = "" if cleared else content
        board.updated_by = writer
        board.updated_at = timezone.now()
        board.save()
        events.emit(space.pk, "blackboard.updated", writer=writer, chars=len(board.content), cleared=cleared)
    return board


def age_string(then: datetime | None, now: datetime | None = None) -> str:
    """Coarse on purpose: the reader needs 'current vs stale', not a stopwatch."""
    if then is None:
        return "never"
    delta = (now or timezone.now()) - then
    if delta < timedelta(minutes=1):
        return "just now"
    if delta < timedelta(hours=1):
        return f"{int(delta.total_seconds() // 60)}m ago"
    if delta < timedelta(days=1):
        return f"{int(delta.total_seconds() // 3600)}h ago"
    return f"{delta.days}d ago"
