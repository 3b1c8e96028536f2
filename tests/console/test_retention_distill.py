"""Retention does not purge an ended session learning has not distilled yet (its notes would be
lost), but only for VERONICA_RETENTION_DISTILL_GRACE_DAYS past the window: a distiller that is off
or failing cannot keep transcripts forever. A session with no turns has nothing to distill."""
from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from learning import api as learning
from veronica.engine import retention, supervisor
from veronica.swarm.learning_bridge import VeronicaSource
from veronica.models import MemoryFile, Session, Space, Turn


@pytest.fixture
def space(world, settings):
    settings.RETENTION_DISTILL_GRACE_DAYS = 7
    Space.objects.filter(pk=world.space.pk).update(retention_days=30)
    return Space.objects.get(pk=world.space.pk)


def ended_session(space: Space, days_ago: int, *, turns: bool = True) -> Session:
    session = Session.objects.create(member=supervisor.get_member(space, "w1"))
    if turns:
        Turn.objects.create(session=session, seq=1, role="user", content="build the release notes")
        Turn.objects.create(session=session, seq=2, role="assistant", content="done: notes in NOTES.md")
    Session.objects.filter(pk=session.pk).update(ended_at=timezone.now() - timedelta(days=days_ago))
    return session


def exists(session: Session) -> bool:
    return Session.objects.filter(pk=session.pk).exists()


def test_an_undistilled_session_waits_for_the_distill_pass_then_goes(space):
    waiting = ended_session(space, 33)
    empty = ended_session(space, 33, turns=False)
    assert retention.preview(space)["awaiting_distill"] == 1
    assert retention.purge_space(space)["sessions"] == 1
    assert exists(waiting) and not exists(empty), "the empty one had nothing to distill"

    notes = '{"notes": [{"name": "release-notes", "content": "# Release notes\\nThey live in NOTES.md."}]}'
    run = learning.run_distill(VeronicaSource(), lambda system, prompt: notes)
    assert run.status == "ok" and MemoryFile.objects.filter(name__startswith="release-notes").exists()
    assert retention.preview(space)["awaiting_distill"] == 0
    out = StringIO()
    call_command("vacuum", "--space", space.slug, stdout=out)
    assert "1 sessions" in out.getvalue() and not exists(waiting)
    assert not Turn.objects.filter(session_id=waiting.pk).exists()


def test_a_broken_distiller_holds_a_session_only_for_the_grace_days(space, settings):
    within = ended_session(space, 30 + 6)
    past = ended_session(space, 30 + 8)
    run = learning.run_distill(VeronicaSource(), lambda system, prompt: "not json at all")  # fails every session
    assert run.status in ("ok", "partial", "error")
    retention.purge_space(space)
    assert exists(within) and not exists(past)
    settings.RETENTION_DISTILL_GRACE_DAYS = 0  # do not wait at all
    retention.purge_space(space)
    assert not exists(within)


def test_the_manage_page_says_how_many_sessions_wait(world, space):
    ended_session(space, 33)
    page = world.client(world.owner).get(reverse("console:manage", args=[space.slug])).content.decode()
    assert 'id="awaiting-distill"' in page and "1 ended sessions wait for learning" in page and "at most 7 days" in page
