"""Odd replies from the real wire formats, through the real SDK adapters and the run loop, in-process."""
from __future__ import annotations

import json

import pytest

from tests.vendors import faults as f
from tests.vendors.mock_anthropic import MockAnthropic
from tests.vendors.mock_openai import MockOpenAI
from veronica.swarm import bus
from veronica.engine import approvals, runner, supervisor
from veronica.models import Approval, Member, Run, Turn, UsageDay


def mock_vendor(cls, vendor: str, key: str, settings, monkeypatch):
    """A started mock server as the vendor's endpoint, one retry with no real wait."""
    with cls(api_key=key) as mock:
        setattr(settings, f"{vendor}_BASE_URL", mock.base_url)
        settings.MODEL_MAX_RETRIES, settings.MODEL_BACKOFF, settings.MODEL_TIMEOUT = 1, 0.01, 5.0
        monkeypatch.setenv(f"{vendor}_API_KEY", key)
        yield mock


@pytest.fixture
def openai_mock(settings, monkeypatch):
    yield from mock_vendor(MockOpenAI, "OPENAI", "sk", settings, monkeypatch)


@pytest.fixture
def anthropic_mock(settings, monkeypatch):
    yield from mock_vendor(MockAnthropic, "ANTHROPIC", "ak", settings, monkeypatch)


def w1_on(space, model):
    w1 = supervisor.get_member(space, "w1")
    Member.objects.filter(pk=w1.pk).update(model=model)
    return Member.objects.get(pk=w1.pk)


def state(member):
    m = Member.objects.get(pk=member.pk)
    return dict(phase=m.phase, run_status=m.run_status, lease=m.lease_token, failures=m.failures,
                parked=bool(m.parked_config), reason=m.error_reason[:200])



def test_idless_tool_calls_reuse_an_old_approval_for_a_new_call(space, openai_mock, django_user_model):
    """An OpenAI-compatible server that sends tool calls without ids (or per-message ids, such as
    Kimi K2's 'functions.NAME:0'): the adapter names each one 'call_<index>', so every turn's first
    call has the same id. A second gated call must get its own approval, not run on the first one's."""
    from veronica.models import MemoryFile

    operator = django_user_model.objects.create_user("op")
    w1 = supervisor.set_permission_mode(w1_on(space, "openai:gpt-mock"), "default", actor="op")
    openai_mock.push(
        f.raw_calls([{"id": None, "name": "memory_write", "arguments": json.dumps({"name": "notes", "content": "harmless"})}]),
        f.raw_calls([{"id": None, "name": "memory_write", "arguments": json.dumps({"name": "notes", "content": "NEVER APPROVED"})}]),
        f.text("done"))
    bus.send(space, "boss", "w1", "take notes")
    assert runner.wake(w1.pk, "message") == "waiting"
    approvals.decide(Approval.objects.get(), approve=True, user=operator)
    runner.wake(w1.pk, "resume")  # runs the approved call; the model's next call is held
    assert Member.objects.get(pk=w1.pk).phase == "waiting-approval"
    runner.wake(w1.pk, "resume")  # any later resume wake (a tick's retry, another decision)
    assert "NEVER APPROVED" not in MemoryFile.objects.get(member=w1).content, "a gated call ran without an approval"
    assert Approval.objects.count() == 2, "the second gated call never reached the operator"


@pytest.mark.parametrize("field", ["name", "id"])
def test_a_tool_call_with_an_overlong_name_or_id_is_an_error_result_not_a_lost_step(space, openai_mock, field):
    """A model that emits a 200-character tool name (or a server with long call ids) must get the
    usual 'unknown tool' error result; the step must not fail on Turn.tool_name (60) / tool_call_id (80)."""
    w1 = w1_on(space, "openai:gpt-mock")
    call = {"id": "call_1", "name": "list_dir", "arguments": "{}"}
    call[field] = ("list_dir_" if field == "name" else "call_") + "x" * 200
    openai_mock.push(f.raw_calls([call]), f.text("done"))
    bus.send(space, "boss", "w1", "go")
    outcome = runner.wake(w1.pk, "message")
    assert outcome == "done", (outcome, state(w1), Run.objects.get().error[:300])
    assert Turn.objects.filter(role="tool").count() == 1



@pytest.mark.parametrize("vendor", ["openai", "anthropic"])
def test_a_stream_that_failed_and_was_retried_inside_the_call_is_metered_too(space, request, vendor):
    """The first attempt streamed 40 chunks of text, then the vendor's in-stream error; the retry
    answered. The partial attempt is billed (the adapter meters it when it is the last attempt), so
    it must be metered when a retry follows as well."""
    mock = request.getfixturevalue(f"{vendor}_mock")
    w1 = w1_on(space, f"{vendor}:model-x")
    mock.push(f.stream_error(after=40), f.text("done"))
    bus.send(space, "boss", "w1", "go")
    assert runner.wake(w1.pk, "message") == "done"
    day = UsageDay.objects.get(member=w1)
    answered = mock.model_requests()[1].usage
    assert day.output_tokens > answered["completion_tokens" if vendor == "openai" else "output_tokens"], \
        "the 40 chunks streamed by the failed attempt were never metered"


@pytest.mark.parametrize("vendor", ["openai", "anthropic"])
def test_a_stream_that_stops_without_its_end_events_is_not_a_final_answer(space, request, vendor):
    """The stream's body ends cleanly mid-answer: no finish_reason / message_delta, no [DONE] /
    message_stop. What arrived is half an answer: it must be retried (or continued), never stored as
    the member's final reply with the goal marked done."""
    mock = request.getfixturevalue(f"{vendor}_mock")
    w1 = w1_on(space, f"{vendor}:model-x")
    mock.push(f.cut("The migration is safe to run because"), f.text("The complete answer."))
    bus.send(space, "boss", "w1", "is the migration safe?")
    runner.wake(w1.pk, "message")
    finals = list(Turn.objects.filter(role="assistant").values_list("content", flat=True))
    assert "The migration is safe to run because" not in finals, finals


@pytest.mark.parametrize("arguments", ['{"path": "sub', "not json", '["sub"]', '"sub"', "null"],
                         ids=["truncated", "garbage", "array", "string", "null"])
def test_tool_arguments_that_are_not_a_json_object_are_a_readable_error(space, openai_mock, tmp_path, arguments):
    """The model's arguments string is not a JSON object. The call must come back as an error result
    the model can read ("arguments are not a JSON object"), not run as if it had passed no arguments."""
    (tmp_path / "alpha" / "sub").mkdir()
    (tmp_path / "alpha" / "secret-at-root.txt").write_text("x")
    w1 = w1_on(space, "openai:gpt-mock")
    openai_mock.push(f.raw_calls([{"id": "call_1", "name": "list_dir", "arguments": arguments}]), f.text("done"))
    bus.send(space, "boss", "w1", "list sub")
    assert runner.wake(w1.pk, "message") == "done"
    result = Turn.objects.get(role="tool").content
    assert result.startswith("error:"), f"list_dir ran with default arguments: {result[:120]!r}"


def test_a_tool_call_cut_at_the_token_limit_leaves_a_request_openai_accepts(space, openai_mock):
    """finish_reason 'length' in the middle of a tool call's arguments, with no text before it. The
    cut call is dropped (right), but the stored assistant turn is then empty, and the continuation
    request carries {"role": "assistant", "content": null} with no tool_calls, which the Chat
    Completions API refuses (400 "Invalid value for 'content': expected a string, got null") — a
    permanent error that would park the member."""
    w1 = w1_on(space, "openai:gpt-mock")
    openai_mock.push(f.raw_calls([{"id": "call_1", "name": "write_file", "arguments": '{"path": "a.txt", "content": "lo'}],
                                 finish="length"), f.text("done"))
    bus.send(space, "boss", "w1", "write a long file")
    assert runner.wake(w1.pk, "message") == "done"
    second = openai_mock.model_requests()[1].body["messages"]
    bad = [m for m in second if m["role"] == "assistant" and m.get("content") is None and not m.get("tool_calls")]
    assert not bad, bad


def test_whitespace_text_before_a_tool_use_is_not_replayed_as_a_text_block(space, anthropic_mock, tmp_path):
    """Claude often sends a text block of just "\\n\\n" before a tool_use. The turn is stored with that
    text, and every later request replays it as {"type": "text", "text": "\\n\\n"}, which the Messages
    API refuses (400 "messages: text content blocks must contain non-whitespace text"): a permanent
    error, on every retry, so the member is parked for good on its own transcript."""
    (tmp_path / "alpha" / "notes.txt").write_text("hello\n")
    w1 = w1_on(space, "anthropic:claude-x")
    anthropic_mock.push(f.raw_calls([{"id": "toolu_1", "name": "read_file", "input": {"path": "notes.txt"}}], text="\n\n"),
                        f.text("done"))
    bus.send(space, "boss", "w1", "read notes.txt")
    assert runner.wake(w1.pk, "message") == "done"
    second = anthropic_mock.model_requests()[1].body["messages"]
    blank = [b for m in second for b in m["content"] if b.get("type") == "text" and not b["text"].strip()]
    assert not blank, blank


def test_duplicate_call_ids_in_one_reply_do_not_lose_an_approved_call(space, openai_mock, django_user_model):
    """Two calls in one reply with the same id (an OpenAI-compatible server's parser bug). The gated
    second call is held and approved, but the first call's result already 'answers' that id, so the
    approved call never runs, its approval is never consumed, and the model is never told."""
    from veronica.models import MemoryFile

    operator = django_user_model.objects.create_user("op")
    w1 = supervisor.set_permission_mode(w1_on(space, "openai:gpt-mock"), "default", actor="op")
    openai_mock.push(f.raw_calls([{"id": "call_dup", "name": "list_dir", "arguments": "{}"},
                                  {"id": "call_dup", "name": "memory_write", "arguments": json.dumps({"name": "n", "content": "c"})}]),
                     f.text("done"))
    bus.send(space, "boss", "w1", "look, then note it")
    assert runner.wake(w1.pk, "message") == "waiting"
    approvals.decide(Approval.objects.get(), approve=True, user=operator)
    assert runner.wake(w1.pk, "resume") == "done"
    assert Approval.objects.get().consumed, "the approved call was never run nor answered"
    assert MemoryFile.objects.filter(member=w1).exists()


@pytest.mark.parametrize("vendor", ["openai", "anthropic"])
def test_a_long_retry_after_is_honoured_by_the_engines_backoff(space, request, vendor):
    """429 with Retry-After: 600. The adapter does not wait that long inline and hands the error back
    'to the engine's re-wake backoff' (sdk.MAX_INLINE_WAIT), but the engine's backoff never reads
    ProviderError.retry_after: the member calls the vendor again after a few seconds."""
    from django.utils import timezone

    mock = request.getfixturevalue(f"{vendor}_mock")
    w1 = w1_on(space, f"{vendor}:model-x")
    mock.push(f.rate_limit(retry_after=600))
    bus.send(space, "boss", "w1", "go")
    assert runner.wake(w1.pk, "message") == "error"
    m = Member.objects.get(pk=w1.pk)
    assert m.retry_at is not None and not m.parked_config
    wait = (m.retry_at - timezone.now()).total_seconds()
    assert wait >= 590, f"retrying in {wait:.0f} s, the vendor asked for 600 s"


@pytest.mark.parametrize("body,content_type", [("<html><body>502 Bad Gateway</body></html>", "text/html"),
                                               ("", "text/event-stream")], ids=["html-page", "empty-stream"])
def test_anthropic_stream_answered_with_a_non_stream_body_is_a_retried_malformed_response(anthropic_mock, body, content_type):
    """A proxy answers the streaming request 200 with an HTML page (or an event stream with no events).
    The SDK's stream helper fails with a bare AssertionError (no message_start), which sdk.call does not
    take for a vendor failure: no inline retry, and the run's recorded error is just 'AssertionError: '."""
    from veronica.agent.providers.anthropic import AnthropicProvider
    from veronica.agent.providers.sdk import CallConfig

    anthropic_mock.push(f.raw(body, content_type=content_type), f.text("recovered"))
    provider = AnthropicProvider("claude-x", anthropic_mock.base_url, "ak", CallConfig(timeout=5, max_retries=1, backoff=0.01))
    reply = provider.complete("SYS", [{"role": "user", "content": "hi"}], [], should_stop=lambda: False)
    assert reply.text == "recovered"


@pytest.mark.parametrize("vendor", ["openai", "anthropic"])
def test_negative_reported_usage_never_lowers_the_meter(space, request, vendor):
    """A proxy reports a negative output count. Metered as is, it lowers the day's tokens, so the
    budget breaker can never trip. Reported counts must be clamped at zero (or the call estimated)."""
    mock = request.getfixturevalue(f"{vendor}_mock")
    w1 = w1_on(space, f"{vendor}:model-x")
    field = "completion_tokens" if vendor == "openai" else "output_tokens"
    mock.push({**f.text("an answer"), "usage_override": {field: -1_000_000}})
    bus.send(space, "boss", "w1", "go")
    assert runner.wake(w1.pk, "message") == "done"
    day = UsageDay.objects.get(member=w1)
    assert day.output_tokens >= 0 and Run.objects.get().tokens >= 0, (day.output_tokens, Run.objects.get().tokens)


def test_an_absurd_reported_usage_is_metered_without_losing_the_step(space, openai_mock):
    """prompt_tokens beyond 2**31 (a proxy's garbage): the reply's step must still commit; on PostgreSQL
    Turn.tokens / Turn.input_tokens / Run.tokens are 32-bit integers and the step's commit failed. A
    count is capped at MAX_TOKENS_PER_CALL per class: past any window, and still far over any budget."""
    from veronica.agent.providers.base import MAX_TOKENS_PER_CALL

    w1 = w1_on(space, "openai:gpt-mock")
    openai_mock.push({**f.text("an answer"), "usage_override": {"prompt_tokens": 3_000_000_000}})
    bus.send(space, "boss", "w1", "go")
    outcome = runner.wake(w1.pk, "message")
    assert outcome == "done", (outcome, Run.objects.get().error[:200])
    assert UsageDay.objects.get(member=w1).input_tokens == MAX_TOKENS_PER_CALL


@pytest.mark.parametrize("vendor", ["openai", "anthropic"])
def test_a_refusal_is_not_retried_forever_as_an_empty_reply(space, request, vendor):
    """Anthropic stop_reason 'refusal' / OpenAI finish_reason 'content_filter' with no content. The
    adapters map both to finish_reason 'content_filter', but the loop treats the reply as merely empty:
    asked again, then a *transient* 'empty replies' error, re-woken with backoff forever (each time
    paying for the prompt), and the reason never says the vendor refused."""
    mock = request.getfixturevalue(f"{vendor}_mock")
    w1 = w1_on(space, f"{vendor}:model-x")
    stop = "content_filter" if vendor == "openai" else "refusal"
    mock.push(f.raw_calls([], finish=stop), f.raw_calls([], finish=stop))
    bus.send(space, "boss", "w1", "something the vendor refuses")
    assert runner.wake(w1.pk, "message") == "error"
    m = Member.objects.get(pk=w1.pk)
    assert "refus" in m.error_reason or "content filter" in m.error_reason or "content_filter" in m.error_reason, m.error_reason
    assert m.parked_config, "a refused prompt is refused again: it should park, not back off and retry forever"



def test_an_anthropic_streamed_tool_input_with_a_lone_surrogate_escape_is_not_a_crash(space, anthropic_mock):
    """Claude writes a tool input whose JSON has a lone surrogate escape ("\\ud800", e.g. code about
    UTF-16). The SDK's stream accumulator raises a bare ValueError ("Unable to parse tool parameter
    JSON from model"), which sdk.call does not classify: the run crashes, the call is not metered, and
    the crash repeats at every retry. (The OpenAI adapter and storable() handle the same input.)"""
    w1 = w1_on(space, "anthropic:claude-x")
    anthropic_mock.push(f.raw_calls([{"id": "toolu_1", "name": "write_file", "input": {"path": "u.txt", "content": "\ud800"}}]),
                        f.text("done"))
    bus.send(space, "boss", "w1", "write the surrogate test file")
    outcome = runner.wake(w1.pk, "message")
    assert UsageDay.objects.filter(member=w1, output_tokens__gt=0).exists(), "the billed call was not metered"
    assert outcome == "done", (outcome, Run.objects.get().error[:160])
