"""The prompt inspector (issue 22.5) shows exactly what the model is sent: the next call's system
prompt and messages before the run, and a past call's after it, compared with what the (scripted)
vendor received."""
from __future__ import annotations

import pytest

from veronica.web import prompt_inspector
from veronica.swarm import bus
from veronica.agent import compaction
from veronica.agent.prompt import system_prompt
from veronica.engine import runner, supervisor
from veronica.plumbing.errors import NotFound
from veronica.models import Member, Run, Turn


def w1_of(space):
    return supervisor.get_member(space, "w1")


def sent(shown: dict) -> list[dict]:
    return [m["message"] for m in shown["messages"]]


def test_the_next_call_is_what_the_run_then_sends(space, scripted):
    Member.objects.filter(space=space, name="w1").update(persona="You are W1, a careful reviewer.")
    bus.send(space, bus.OPERATOR, "w1", "review src/", subject="review")
    shown = prompt_inspector.next_call(w1_of(space))
    provider = scripted("reviewed")
    assert runner.wake(w1_of(space).pk, "message") == "done"
    assert shown["system_prompt"] == provider.systems[0]
    assert sent(shown) == provider.requests[0]
    assert shown["system_parts"][0] == {"part": "persona", "text": "You are W1, a careful reviewer."}


def test_a_past_call_shows_its_runs_system_prompt_and_the_messages_it_was_sent(space, scripted):
    provider = scripted(("list_dir", {"path": "."}), "all listed")
    bus.send(space, "boss", "w1", "list the workspace")
    assert runner.wake(w1_of(space).pk, "message") == "done"
    Member.objects.filter(space=space, name="w1").update(persona="a later persona")  # not what that run sent
    calls = list(Turn.objects.filter(role="assistant").order_by("seq"))
    for turn, request in zip(calls, provider.requests):
        shown = prompt_inspector.past_call(w1_of(space), turn.pk)
        assert sent(shown) == request
        assert shown["system_prompt"] == provider.systems[0] == Run.objects.get().system_prompt
        assert shown["reported_input_tokens"] == 100 and shown["run"] == Run.objects.get().pk
    assert [c["id"] for c in prompt_inspector.past_calls(w1_of(space))] == [t.pk for t in reversed(calls)]


def test_tokens_per_part_add_up_to_the_share_of_the_window(space):
    Member.objects.filter(space=space, name="w1").update(persona="p" * 4000, model="offline")
    shown = prompt_inspector.next_call(w1_of(space))
    parts = {p["part"]: p for p in shown["parts"]}
    assert parts["persona"]["tokens"] == 1000 and parts["tool definitions"]["tokens"] > 0
    assert shown["total_tokens"] == sum(p["tokens"] for p in shown["parts"])
    assert shown["context_window"] == compaction.context_window("offline")
    assert shown["share"] == round(100 * shown["total_tokens"] / shown["context_window"], 2)
    chars = sum(p["chars"] for p in shown["parts"] if not p["part"].startswith(("transcript", "tool definitions")))
    assert chars == len(system_prompt(w1_of(space))), "the parts and their separators are the whole system prompt"


def test_a_call_of_another_member_is_not_found(space, scripted):
    scripted("hi")
    bus.send(space, "boss", "w1", "x")
    runner.wake(w1_of(space).pk, "message")
    turn = Turn.objects.get(role="assistant")
    with pytest.raises(NotFound):
        prompt_inspector.past_call(supervisor.get_member(space, "w2"), turn.pk)
