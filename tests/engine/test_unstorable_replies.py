"""What a model writes is kept, never a reason to fail: a NUL or an unpaired surrogate in a reply's text
or its tool calls' arguments failed the step's transaction on PostgreSQL (and every retry of it). It is
stored as U+FFFD, in both modes alike."""
from __future__ import annotations

import pytest

from veronica.swarm import bus
from veronica.engine import runner, supervisor
from veronica.plumbing.errors import storable
from veronica.models import Event, Turn, TurnRole

pytestmark = pytest.mark.django_db


def test_a_reply_with_a_nul_and_a_lone_surrogate_is_stored_and_the_run_finishes(space, scripted):
    scripted(("read_file", {"path": "a\x00b.txt", "note\x00": ["x\ud800"]}), "done \x00 here")
    bus.send(space, "boss", "w1", "go")
    w1 = supervisor.get_member(space, "w1")
    assert runner.wake(w1.pk, "message") == "done"
    turns = list(Turn.objects.filter(session__member=w1).order_by("seq"))
    call = next(t for t in turns if t.role == TurnRole.ASSISTANT and t.tool_calls)
    assert call.tool_calls[0]["args"] == {"path": "a\ufffdb.txt", "note\ufffd": ["x\ufffd"]}
    assert turns[-1].content == "done \ufffd here"
    assert Event.objects.filter(space=space, kind="tool.called", payload__args__path="a\ufffdb.txt").exists()


def test_storable_keeps_what_is_already_storable():
    value = {"a": ["b", 1, None, {"c": "d\U0001F600"}], "e": 2.5}
    assert storable(value) == value
    assert storable("pair \ud83d\ude00 joined") == "pair \U0001F600 joined"
