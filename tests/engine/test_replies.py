"""Replies that are not answers (issue 10.6) and the budget after every call (issue 10.7)."""
from __future__ import annotations

from veronica.swarm import bus
from veronica.agent.providers.base import Reply, ToolCall, Usage
from veronica.engine import runner, supervisor
from veronica.models import Event, Member, Message, Run, Turn, UsageDay


def w1_of(space):
    return supervisor.get_member(space, "w1")


def empty():
    return Reply(text="", usage=Usage(input=100, output=0), finish_reason="stop")


def test_an_empty_reply_is_asked_again_and_the_second_answer_counts(space, scripted):
    provider = scripted(empty(), "the real answer")
    bus.send(space, "boss", "w1", "the goal")
    assert runner.wake(w1_of(space).pk, "message") == "done"
    assert len(provider.requests) == 2
    assert list(Turn.objects.values_list("role", "content")) == [("user", Turn.objects.first().content), ("assistant", "the real answer")]
    assert Event.objects.filter(kind="agent.empty_reply").count() == 1


def test_empty_replies_in_a_row_are_an_error_and_the_goal_stays_unread(space, scripted):
    provider = scripted(empty(), Reply(text="  \n", finish_reason="stop"), "never reached")
    bus.send(space, "boss", "w1", "the goal")
    assert runner.wake(w1_of(space).pk, "message") == "error"
    assert len(provider.requests) == 2
    assert not Turn.objects.filter(role="assistant").exists()
    assert Message.objects.get(recipient__name="w1").read_at is None, "an empty reply must not mark the goal read"
    w1 = w1_of(space)
    assert w1.phase == "error" and "empty replies" in w1.error_reason and w1.retry_at is not None and not w1.parked_config
    assert Run.objects.get().outcome == "error"


def test_a_reply_cut_at_the_token_limit_is_continued_not_taken_as_final(space, scripted):
    cut = Reply(text="Part one of the ans", usage=Usage(input=100, output=4096), finish_reason="length")
    provider = scripted(cut, "wer. Done.")
    bus.send(space, "boss", "w1", "write a long answer")
    assert runner.wake(w1_of(space).pk, "message") == "done"
    roles = list(Turn.objects.values_list("role", flat=True))
    assert roles == ["user", "assistant", "user", "assistant"]
    assert "cut off" in provider.requests[1][-1]["content"]
    assert Turn.objects.filter(role="assistant").last().content == "wer. Done."


def test_cut_tool_calls_are_never_run(space, scripted, tmp_path):
    cut = Reply(tool_calls=[ToolCall(id="c1", name="write_file", args={"path": "half.txt", "content": "trunc"})],
                usage=Usage(input=100, output=4096), finish_reason="length")
    scripted(cut, "ok")
    bus.send(space, "boss", "w1", "write")
    assert runner.wake(w1_of(space).pk, "message") == "done"
    assert not (tmp_path / "alpha" / "half.txt").exists()


def test_replies_cut_again_and_again_park_the_member_with_the_reason(space, scripted):
    cut = Reply(text="and so", usage=Usage(input=10, output=10), finish_reason="length")
    scripted(cut, cut, cut, "never")
    bus.send(space, "boss", "w1", "x")
    assert runner.wake(w1_of(space).pk, "message") == "error"
    w1 = w1_of(space)
    assert w1.parked_config and "max tokens" in w1.error_reason
    last = Turn.objects.order_by("-seq").first()
    assert last.role == "user", "the work in progress ends with a request to continue, not a final answer"


def test_text_only_runs_trip_the_budget(space, scripted):
    """3 text-only runs used to spend 9,300 tokens against a 1,000 budget: the breaker never looked."""
    Member.objects.filter(name="w1").update(budget_override=1000)
    big = Reply(text="a long essay", usage=Usage(input=2800, output=300), finish_reason="stop")
    provider = scripted(big, big, big)
    bus.send(space, "boss", "w1", "essay 1")
    assert runner.wake(w1_of(space).pk, "message") == "budget"
    bus.send(space, "boss", "w1", "essay 2")
    assert runner.wake(w1_of(space).pk, "message") == "budget-tripped"
    assert len(provider.requests) == 1
    assert Event.objects.filter(kind="ops.alert", payload__subject="budget tripped").count() == 1
    assert Message.objects.filter(recipient__name="w1", body__contains="essay 1").get().read_at is not None


def test_tool_calls_of_the_call_that_tripped_the_budget_are_answered_not_run(space, scripted, tmp_path):
    Member.objects.filter(name="w1").update(budget_override=100)
    call = Reply(tool_calls=[ToolCall(id="c1", name="write_file", args={"path": "x.txt", "content": "1"})],
                 usage=Usage(input=150, output=10), finish_reason="tool_calls")
    scripted(call)
    bus.send(space, "boss", "w1", "write")
    assert runner.wake(w1_of(space).pk, "message") == "budget"
    assert not (tmp_path / "alpha" / "x.txt").exists()
    assert "budget tripped" in Turn.objects.get(role="tool").content


def test_a_reply_without_usage_is_estimated_and_marked(space, scripted):
    scripted(Reply(text="an answer of some length", finish_reason="stop"))
    bus.send(space, "boss", "w1", "hi")
    runner.wake(w1_of(space).pk, "message")
    day = UsageDay.objects.get(member__name="w1")
    assert day.input_tokens > 0 and day.output_tokens > 0, "a reply without usage is never metered as zero"
    assert day.estimated_calls == 1 and day.model_calls == 1
    assert Run.objects.get().tokens == day.input_tokens + day.output_tokens


def test_reported_usage_is_not_marked_estimated(space, scripted):
    scripted("fine")
    bus.send(space, "boss", "w1", "hi")
    runner.wake(w1_of(space).pk, "message")
    assert UsageDay.objects.get(member__name="w1").estimated_calls == 0
