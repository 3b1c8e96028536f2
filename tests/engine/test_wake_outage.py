"""Wakes across an outage: mail sent while the broker refused its wake is rung at the engine's
next tick (not after the unread sweep's wait), and a worker that cannot reach the database hands
its wakes back to the broker at once instead of failing each on a connect timeout."""
from __future__ import annotations

import pytest
from django.db import OperationalError

from veronica import bus
from veronica.engine import runner, supervisor, tick

pytestmark = pytest.mark.django_db


@pytest.fixture
def broker(monkeypatch):
    """django-q2's enqueue, refusing while `down` is set and recording what it accepted."""
    import django_q.tasks

    state = {"down": True, "sent": []}

    def async_task(func, member_id, source, q_options=None):
        if state["down"]:
            raise ConnectionError("Redis is down")
        state["sent"].append((member_id, source))
    monkeypatch.setattr(django_q.tasks, "async_task", async_task)
    return state


def test_mail_sent_while_the_broker_was_down_is_rung_at_the_next_tick(space, broker, django_capture_on_commit_callbacks):
    w1 = supervisor.get_member(space, "w1")
    with django_capture_on_commit_callbacks(execute=True):
        bus.send(space, "operator", "w1", "are you there?")
    assert broker["sent"] == [], "the broker refused the wake"
    broker["down"] = False
    with django_capture_on_commit_callbacks(execute=True):
        tick.tick()
    assert [member for member, _ in broker["sent"]] == [w1.pk], "rung at the first tick after the broker is back"


def test_a_worker_cut_off_from_the_database_hands_its_wakes_back_at_once(space, broker, monkeypatch):
    broker["down"] = False
    w1 = supervisor.get_member(space, "w1")
    claims = []

    def unreachable(*args):
        claims.append(args)
        raise OperationalError("connection to server at 127.0.0.1 failed: timeout expired")
    monkeypatch.setattr(runner, "first_claim", unreachable)
    monkeypatch.setattr(runner, "BOUNCE_PAUSE", 0)
    monkeypatch.setattr(runner, "_database_down_until", 0.0)
    assert runner.wake(w1.pk, "message") == "handed-back"
    assert runner.wake(w1.pk, "message") == "handed-back"
    assert len(claims) == 1, "within the outage window the database is not tried again (no connect timeout per wake)"
    assert broker["sent"] == [(w1.pk, "message"), (w1.pk, "message")], "each wake went back to the broker, for a host that can run it"
