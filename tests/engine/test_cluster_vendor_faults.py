"""The failure model, replies that are not answers and the budget, on the real cluster against the
mock vendor servers (both wire formats): issue 10 items 5, 6 and 7 over real HTTP."""
from __future__ import annotations

import time

import pytest
from django.db import close_old_connections

from tests.conftest import make_space
from tests.harness import isolate_queue, qcluster, wait_for
from tests.vendors import faults as f
from tests.vendors.mock_anthropic import MockAnthropic
from tests.vendors.mock_openai import MockOpenAI
from veronica.swarm import bus
from veronica.engine import supervisor, tick
from veronica.engine.wakes import enqueue_wake
from veronica.models import Event, Member, Message, Run, RunOutcome, Turn, UsageDay

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]
FAST = {"VERONICA_MODEL_MAX_RETRIES": "1", "VERONICA_MODEL_BACKOFF": "0.05", "VERONICA_RUN_RETRY_BASE_SECONDS": "1"}


@pytest.fixture(autouse=True)
def own_queue():
    isolate_queue()
    yield
    close_old_connections()


def worker_on(space, model: str, **fields) -> Member:
    w1 = supervisor.get_member(space, "w1")
    Member.objects.filter(pk=w1.pk).update(model=model, **fields)
    return Member.objects.get(pk=w1.pk)


def fresh(member: Member) -> Member:
    close_old_connections()
    return Member.objects.get(pk=member.pk)


def settled(member: Member) -> bool:
    close_old_connections()
    return not Member.objects.get(pk=member.pk).lease_token and not Message.objects.filter(recipient=member, read_at__isnull=True).exists()


def ticking(predicate, timeout: float, message: str):
    def step():
        close_old_connections()
        tick.tick()
        return predicate()
    return wait_for(step, timeout, interval=0.5, message=message)


def test_anthropic_overload_after_the_first_turn_backs_off_and_finishes_the_goal(tmp_path):
    space = make_space(tmp_path, workers=("w1",))
    w1 = worker_on(space, "anthropic:claude-haiku-4-5")
    (tmp_path / "alpha" / "notes.txt").write_text("hello\n")
    with MockAnthropic(api_key="ak") as mock:
        mock.push(f.tool_call("read_file", {"path": "notes.txt"}), f.overloaded(), f.overloaded(), f.text("It says hello."))
        with qcluster(workers=2, ANTHROPIC_BASE_URL=mock.base_url, ANTHROPIC_API_KEY="ak", **FAST):
            bus.send(space, "boss", "w1", "read notes.txt")
            ticking(lambda: Run.objects.filter(member=w1, outcome=RunOutcome.DONE).exists() and settled(w1), 60,
                    "the goal to be done after the backoff")
    assert list(Run.objects.filter(member=w1).order_by("id").values_list("outcome", flat=True)) == ["error", "done"]
    assert Turn.objects.filter(session__member=w1, role="assistant").last().content == "It says hello."
    assert len(mock.model_requests()) == 4
    assert fresh(w1).failures == 0


def test_openai_401_parks_the_member_with_one_alert_until_resumed(tmp_path):
    space = make_space(tmp_path, workers=("w1",))
    w1 = worker_on(space, "openai:gpt-4.1-mini")
    with MockOpenAI(api_key="sk") as mock:
        mock.push(f.unauthorized(), f.text("working again"))
        with qcluster(workers=2, OPENAI_BASE_URL=mock.base_url, OPENAI_API_KEY="sk", **FAST):
            bus.send(space, "boss", "w1", "the goal")
            ticking(lambda: fresh(w1).parked_config and not fresh(w1).lease_token, 30, "the member to be parked")
            deadline = time.monotonic() + 6
            while time.monotonic() < deadline:  # ticks, doorbells and new mail: the vendor hears nothing
                close_old_connections()
                tick.tick()
                enqueue_wake(w1.pk, "message")
                time.sleep(0.5)
            bus.send(space, "boss", "w1", "still there?")
            time.sleep(1.5)
            assert len(mock.model_requests()) == 1
            assert fresh(w1).phase == "error" and "401" in fresh(w1).error_reason
            supervisor.resume(fresh(w1), actor="op")
            ticking(lambda: settled(w1) and Run.objects.filter(member=w1, outcome="done").exists(), 30, "the resumed run")
    assert len(mock.model_requests()) == 2
    assert Event.objects.filter(kind="ops.alert", member_id=w1.pk).count() == 1


def test_empty_replies_and_a_max_tokens_cut_are_not_final_answers(tmp_path):
    space = make_space(tmp_path, workers=("w1",))
    w1 = worker_on(space, "anthropic:claude-haiku-4-5")
    with MockAnthropic(api_key="ak") as mock:
        mock.push(f.empty(), f.empty(), f.max_tokens("The answer is cut off mid-sen"), f.text("tence. Done."))
        with qcluster(workers=2, ANTHROPIC_BASE_URL=mock.base_url, ANTHROPIC_API_KEY="ak", **FAST):
            bus.send(space, "boss", "w1", "answer at length")
            ticking(lambda: Run.objects.filter(member=w1, outcome=RunOutcome.DONE).exists() and settled(w1), 60,
                    "the continued answer")
    assert list(Run.objects.filter(member=w1).order_by("id").values_list("outcome", flat=True)) == ["error", "done"]
    assert list(Turn.objects.filter(session__member=w1, role="assistant").values_list("content", flat=True)) == [
        "The answer is cut off mid-sen", "tence. Done."]
    assert "cut off" in mock.model_requests()[-1].body["messages"][-1]["content"][-1]["text"]


def test_text_only_runs_trip_the_budget_and_a_reply_without_usage_is_estimated(tmp_path):
    space = make_space(tmp_path, workers=("w1",))
    w1 = worker_on(space, "openai:gpt-4.1-mini", budget_override=1000)
    with MockOpenAI(api_key="sk") as mock:
        mock.push(f.no_usage("a long essay " * 50), f.text("another essay"))
        with qcluster(workers=2, OPENAI_BASE_URL=mock.base_url, OPENAI_API_KEY="sk", **FAST):
            bus.send(space, "boss", "w1", "essay one")
            ticking(lambda: Run.objects.filter(member=w1, outcome=RunOutcome.BUDGET).exists() and not fresh(w1).lease_token,
                    30, "the breaker")
            bus.send(space, "boss", "w1", "essay two")
            time.sleep(3)
    assert len(mock.model_requests()) == 1, "a tripped member must not call the vendor again"
    day = UsageDay.objects.get(member=w1)
    assert day.tripped and day.estimated_calls == 1 and day.input_tokens > 1000
    assert Event.objects.filter(kind="ops.alert", member_id=w1.pk, payload__subject="budget tripped").count() == 1
