"""Open-session usage per member, as two subquery annotations (no query per member).

session_tokens: the tokens of every model call in the member's open session (the seed's
MemberView.Usage); last_turn_input: the newest call's input tokens (context pressure).
"""
from __future__ import annotations

from django.db.models import IntegerField, OuterRef, QuerySet, Subquery, Sum, Value
from django.db.models.functions import Coalesce

from veronica.models import Member, Turn, TurnRole


def with_session_usage(members: QuerySet[Member]) -> QuerySet[Member]:
    open_turns = Turn.objects.filter(session__member=OuterRef("pk"), session__ended_at__isnull=True, role=TurnRole.ASSISTANT)
    total = open_turns.order_by().values("session__member").annotate(s=Sum("tokens")).values("s")
    last = open_turns.order_by("-session_id", "-seq").values("input_tokens")[:1]
    return members.annotate(session_tokens=Coalesce(Subquery(total, output_field=IntegerField()), Value(0)),
                            last_turn_input=Coalesce(Subquery(last, output_field=IntegerField()), Value(0)))
