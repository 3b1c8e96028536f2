"""What the runs a worker starts at once would each read before their first model call, read for all of
them in a few statements: their transcripts and waggle's view of their sessions.

A worker that replaces a dead one resumes its predecessor's runs all at once (veronica.engine.runner.
resume_here: ~250 in bench/fleet.py). Each run read its transcript, then waggle's ring of its session
and whether a replay of it waits: three round trips per run, each holding one of the worker's pooled
connections (eight) while 250 threads took turns at the GIL, so the resumes queued for connections
for over a second. Read here, in three statements for all of them, by the thread that claimed them,
before any of them runs. The answers are true when read: each run holds its member's slot from its
claim, so nobody else writes its session until it ends. A run given no answer (a session not read
here) reads its own, as before.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from veronica.agent import waggle_bridge
from veronica.models import Member, Session, Turn


@dataclass
class Ahead:
    """One run's start, read ahead: its session's turns, in order, and waggle's view (waggle_bridge.pinned)."""
    turns: list[Turn] = field(default_factory=list)
    waggle: object = None


def read(starts: list[tuple[Member, Session]]) -> dict[int, Ahead]:
    """For each (member, its open session): what its run's start reads, by session id. Sessions opened
    by the claim (fresh) are known empty and left out."""
    sessions = {session.pk: (member, session) for member, session in starts if session is not None and not getattr(session, "fresh", False)}
    if not sessions:
        return {}
    ahead = {pk: Ahead() for pk in sessions}
    for turn in Turn.objects.filter(session_id__in=list(sessions)).order_by("session_id", "seq"):
        turn.session = sessions[turn.session_id][1]
        ahead[turn.session_id].turns.append(turn)
    for pk, seen in waggle_bridge.read_ahead([(member, session) for member, session in sessions.values()]).items():
        ahead[pk].waggle = seen
    return ahead
