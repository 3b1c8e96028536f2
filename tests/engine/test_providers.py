"""Both vendors through their official SDKs against our mock servers (real HTTP, both wire formats,
JSON and SSE streaming), with every scripted fault. No client patching."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import pytest

from tests.vendors import faults as f
from tests.vendors.mock_anthropic import MockAnthropic
from tests.vendors.mock_openai import MockOpenAI
from veronica.agent.providers.anthropic import AnthropicProvider
from veronica.agent.providers.base import Cancelled, ProviderError
from veronica.agent.providers.openai_compat import OpenAIProvider
from veronica.agent.providers.sdk import CallConfig

MESSAGES = [
    {"role": "user", "content": "list the files"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "t1", "name": "list_dir", "args": {"path": "."}}]},
    {"role": "tool", "tool_call_id": "t1", "name": "list_dir", "content": "a.py"},
]
TOOLS = [{"name": "list_dir", "description": "List", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": []}},
         {"name": "read_file", "description": "Read", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": []}}]
FAST = {"timeout": 1.0, "max_retries": 2, "backoff": 0.01, "stream": True, "max_tokens": 256}
NEVER = lambda: False  # noqa: E731


@dataclass
class Vendor:
    name: str
    mock: MockOpenAI | MockAnthropic
    make: Callable[..., OpenAIProvider | AnthropicProvider]

    def provider(self, **cfg):
        return self.make(**cfg)


def _vendor(name: str):
    mock_cls, provider_cls = {"openai": (MockOpenAI, OpenAIProvider), "anthropic": (MockAnthropic, AnthropicProvider)}[name]
    mock = mock_cls().start()
    return mock, Vendor(name, mock, lambda **cfg: provider_cls("model-x", mock.base_url, "test-key", CallConfig(**{**FAST, **cfg})))


@pytest.fixture(params=["openai", "anthropic"])
def vendor(request):
    mock, v = _vendor(request.param)
    yield v
    mock.stop()


@pytest.fixture(params=[True, False], ids=["stream", "json"])
def stream(request):
    return request.param


def call(provider, events=None, should_stop=NEVER):
    return provider.complete("SYS", MESSAGES, TOOLS, should_stop=should_stop, on_event=(events.append if events is not None else None))


# --- wire format -------------------------------------------------------------------------------------

def test_openai_wire_format_and_usage(stream):
    mock, v = _vendor("openai")
    try:
        mock.push(f.tool_call("read_file", {"path": "a.py"}))
        reply = call(v.provider(stream=stream))
        req = mock.model_requests()[0]
        body = req.body
        assert req.path == "/v1/chat/completions" and req.headers["authorization"] == "Bearer test-key"
        assert body["model"] == "model-x" and body["messages"][0] == {"role": "system", "content": "SYS"}
        assert body["messages"][2]["tool_calls"][0]["function"] == {"name": "list_dir", "arguments": "{\"path\": \".\"}"}
        assert body["messages"][3] == {"role": "tool", "tool_call_id": "t1", "content": "a.py"}
        assert body["tools"][0] == {"type": "function", "function": TOOLS[0]}
        assert bool(body.get("stream")) is stream and (body.get("stream_options") == {"include_usage": True}) is stream
        assert reply.tool_calls[0].name == "read_file" and reply.tool_calls[0].args == {"path": "a.py"}
        assert reply.finish_reason == "tool_calls"
        usage = req.usage
        assert (reply.usage.input, reply.usage.output) == (usage["prompt_tokens"], usage["completion_tokens"])
        assert not reply.usage.estimated
    finally:
        mock.stop()


def test_anthropic_wire_format_usage_and_cache_breakpoints(stream):
    mock, v = _vendor("anthropic")
    try:
        mock.push(f.tool_call("read_file", {"path": "a.py"}, text="Reading."))
        reply = call(v.provider(stream=stream))
        req = mock.model_requests()[0]
        body = req.body
        assert req.path == "/v1/messages" and req.headers["anthropic-version"]
        assert body["max_tokens"] == 256 and bool(body.get("stream")) is stream
        assert body["system"] == [{"type": "text", "text": "SYS", "cache_control": {"type": "ephemeral"}}]
        assert body["tools"][0]["input_schema"]["type"] == "object" and "cache_control" not in body["tools"][0]
        assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"}  # the tool schemas are the stable prefix
        assert body["messages"][1] == {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "list_dir", "input": {"path": "."}}]}
        assert body["messages"][2]["content"][0] == {"type": "tool_result", "tool_use_id": "t1", "content": "a.py",
                                                     "cache_control": {"type": "ephemeral"}}
        assert reply.text == "Reading." and reply.tool_calls[0].args == {"path": "a.py"}
        assert reply.finish_reason == "tool_calls"
        assert (reply.usage.input, reply.usage.output) == (req.usage["input_tokens"], req.usage["output_tokens"])
    finally:
        mock.stop()


def test_streamed_text_reaches_on_event_as_it_is_generated(vendor):
    vendor.mock.push(f.text("The quick brown fox jumps over the lazy dog", chunks=5))
    events: list[dict] = []
    reply = call(vendor.provider(), events)
    deltas = [e["delta"] for e in events if e["type"] == "text"]
    assert len(deltas) >= 5 and "".join(deltas) == reply.text == "The quick brown fox jumps over the lazy dog"
    assert reply.finish_reason == "stop"


def test_one_connection_is_reused_across_calls(vendor, stream):
    """Streamed too: a stream read to its end hands its connection back (the OpenAI SDK's own stream
    closed it unread at [DONE], so every streamed call opened a new one)."""
    vendor.mock.push(f.tool_call("list_dir", {"path": "."}))
    provider = vendor.provider(stream=stream)
    call(provider)
    call(vendor.provider(stream=stream))  # a new provider for the same endpoint shares the pooled client
    ports = [r.port for r in vendor.mock.model_requests()]
    assert len(ports) == 2 and ports[0] == ports[1]


def test_a_connection_cut_by_a_fault_or_a_cancel_is_not_reused(vendor):
    vendor.mock.push(f.stream_error(after=1), f.text("recovered"), f.generate(chunks=400, delay=0.05), f.text("again"))
    provider = vendor.provider(timeout=30.0)
    assert call(provider).text == "recovered"
    with pytest.raises(Cancelled):
        call(provider, [], _cancel_after(0.3))
    assert call(provider).text == "again"
    errored, recovered, cancelled, again = vendor.mock.model_requests()
    assert cancelled.disconnected_at is not None and again.port != cancelled.port


# --- the OpenAI event stream, read off the wire --------------------------------------------------------------

def _chunk(delta: dict | None = None, finish: str | None = None, **extra) -> str:
    import json

    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return json.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": choices, **extra})


def test_openai_stream_split_anywhere_is_read_whole():
    """Events split mid-line, mid-JSON and between CR and LF, CRLF and CR line ends, a keep-alive
    comment, a multi-line data field, two tool calls whose deltas interleave, the usage chunk after
    the finish reason: the reply is the same as one written in whole events."""
    def data(delta=None, finish=None, **extra) -> str:
        return "data: " + _chunk(delta, finish, **extra)

    second = data({"content": "lo wor"})
    last_call = data({"tool_calls": [{"index": 1, "function": {"arguments": '{"path": "a.py"}'}}]}, "tool_calls")
    cut = last_call.index('"object"')  # between two members of the object: a line break there is JSON whitespace
    pieces = [": keep-alive\r\n\r\n", data({"role": "assistant", "content": "Hel"}) + "\r", "\n\r\n",
              second[:25], second[25:] + "\n\n", data({"content": "ld!"}) + "\r\r",
              data({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                    "function": {"name": "list_dir", "arguments": '{"pa'}}]}) + "\n\n"
              + data({"tool_calls": [{"index": 1, "id": "call_b", "function": {"name": "read_file", "arguments": ""}}]}) + "\n\n",
              data({"tool_calls": [{"index": 0, "function": {"arguments": 'th": "."}'}}]}) + "\n",
              "\n" + last_call[:cut] + "\ndata: ", last_call[cut:] + "\n\n",  # one event in two data lines
              data(usage={"prompt_tokens": 50, "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": 0}}) + "\n\n",
              "data: [DONE]\n\n"]
    mock, v = _vendor("openai")
    try:
        mock.push(f.frames(pieces))
        events: list[dict] = []
        reply = call(v.provider(), events)
    finally:
        mock.stop()
    assert [e["delta"] for e in events if e["type"] == "text"] == ["Hel", "lo wor", "ld!"]
    assert reply.text == "Hello world!" and reply.finish_reason == "tool_calls"
    assert [(c.id, c.name, c.args) for c in reply.tool_calls] == [("call_a", "list_dir", {"path": "."}),
                                                                  ("call_b", "read_file", {"path": "a.py"})]
    assert (reply.usage.input, reply.usage.output, reply.usage.estimated) == (50, 9, False)


def test_openai_body_held_open_after_done_costs_the_connection_not_the_call():
    """A server (a proxy) that keeps the body open after [DONE]: the reply is complete, so the call
    returns at once and that connection is given up, not waited on for the read timeout."""
    pieces = ["data: " + _chunk({"content": "done"}, "stop") + "\n\n", "data: [DONE]\n\n"]
    mock, v = _vendor("openai")
    try:
        mock.push(f.frames(pieces, hold=5.0), f.text("next"))
        provider = v.provider(timeout=10.0)
        started = time.monotonic()
        assert call(provider).text == "done"
        assert time.monotonic() - started < 2.0
        assert call(provider).text == "next"
        held, after = mock.model_requests()
        assert after.port != held.port
    finally:
        mock.stop()


@pytest.mark.parametrize("behaviour,error", [
    (f.stream_error(after=2), "openai: stream error server: The server is overloaded"),
    (f.frames(["data: " + _chunk({"content": "par"}) + "\n\n", 'data: {"choices": [\n\n']), "openai: malformed response"),
    (f.frames(["data: " + _chunk({"content": "x"}) + "\n\n", "data: \udcff\n\n"]), "openai: malformed response"),
    (f.frames(["data: " + _chunk({"content": "x"}) + "\n\n"], hold=3.0), "openai: timeout"),
], ids=["error event", "broken json", "not utf-8", "read timeout mid-stream"])
def test_openai_stream_failures_read_as_before(behaviour, error):
    """Mid-stream failures keep the words the SDK's own stream gave them (the console and the retry
    logic read them), and what was streamed before is billed as an estimate."""
    mock, v = _vendor("openai")
    try:
        mock.push(behaviour)
        with pytest.raises(ProviderError) as caught:
            call(v.provider(max_retries=0, timeout=0.5))
    finally:
        mock.stop()
    assert str(caught.value).startswith(error) and not caught.value.permanent
    assert caught.value.usage is not None and caught.value.usage.estimated


# --- faults: transient ones are retried (visibly), permanent ones are not ----------------------------------

TRANSIENT = {
    "429 Retry-After": (f.rate_limit(retry_after=0.2), "HTTP 429"),
    "429 retry-after-ms": (f.rate_limit(retry_after=None, ms=150), "HTTP 429"),
    "500": (f.status(500), "HTTP 500"),
    "503": (f.status(503, "unavailable"), "HTTP 503"),
    "529 overloaded": (f.overloaded(), "HTTP 529"),
    "hang past the read timeout": (f.hang(5), "timeout"),
    "malformed body": (f.malformed(), "malformed response"),
    "malformed stream": (f.malformed(stream_after=2), "malformed response"),
    "error event mid-stream": (f.stream_error(after=2), "stream error"),
}


@pytest.mark.parametrize("fault", list(TRANSIENT), ids=list(TRANSIENT))
def test_transient_faults_are_retried_with_visible_state(vendor, fault, stream):
    behaviour, reason = TRANSIENT[fault]
    if fault in ("malformed stream", "error event mid-stream") and not stream:
        pytest.skip("a stream fault needs a stream")
    vendor.mock.push(behaviour, f.text("recovered"))
    events: list[dict] = []
    reply = call(vendor.provider(stream=stream), events)
    assert reply.text == "recovered"
    retries = [e for e in events if e["type"] == "retry"]
    assert len(retries) == 1 and retries[0]["reason"].startswith(reason), retries
    assert len(vendor.mock.model_requests()) == 2


def test_overloaded_reason_reads_like_the_console_line():
    mock, v = _vendor("anthropic")
    try:
        mock.push(f.overloaded())
        events: list[dict] = []
        call(v.provider(), events)
        assert events[0]["type"] == "retry" and events[0]["reason"] == "HTTP 529 overloaded"
    finally:
        mock.stop()


@pytest.mark.parametrize("behaviour,expected", [(f.rate_limit(retry_after=0.4), 0.4), (f.rate_limit(retry_after=None, ms=300), 0.3)],
                         ids=["Retry-After", "retry-after-ms"])
def test_the_vendors_retry_delay_is_honoured(vendor, behaviour, expected):
    vendor.mock.push(behaviour)
    events: list[dict] = []
    call(vendor.provider(), events)
    assert events[0]["type"] == "retry" and events[0]["delay"] == pytest.approx(expected)
    first, second = vendor.mock.model_requests()[:2]
    assert second.started - first.started >= expected


def test_transient_faults_give_up_after_max_retries(vendor):
    vendor.mock.push(f.status(500), f.status(502), f.overloaded())
    with pytest.raises(ProviderError) as caught:
        call(vendor.provider(max_retries=2))
    error = caught.value
    assert not error.permanent and error.status == 529 and error.request_id.startswith("req_")
    assert "gave up after 3 attempt(s)" in str(error) and len(vendor.mock.model_requests()) == 3


@pytest.mark.parametrize("behaviour,status", [(f.unauthorized(), 401), (f.context_overflow(), 400), (f.status(403, "forbidden"), 403),
                                              (f.status(404, "model not found"), 404)], ids=["401", "400 context", "403", "404"])
def test_permanent_faults_are_not_retried_and_carry_the_request_id(vendor, behaviour, status, stream):
    vendor.mock.push(behaviour)
    with pytest.raises(ProviderError) as caught:
        call(vendor.provider(stream=stream))
    error = caught.value
    assert error.permanent and error.status == status and error.request_id.startswith("req_")
    assert error.request_id in str(error) and len(vendor.mock.model_requests()) == 1


def test_context_overflow_says_so(vendor):
    vendor.mock.push(f.context_overflow())
    with pytest.raises(ProviderError, match="context length|prompt is too long"):
        call(vendor.provider())


def test_a_wrong_key_is_permanent(vendor):
    provider = type(vendor.provider())("model-x", vendor.mock.base_url, "wrong-key", CallConfig(**FAST))
    with pytest.raises(ProviderError) as caught:
        call(provider)
    assert caught.value.permanent and caught.value.status == 401


def test_a_dead_base_url_is_a_transient_connection_error(vendor):
    vendor.mock.stop()
    with pytest.raises(ProviderError, match="connection error") as caught:
        call(vendor.provider(max_retries=1))
    assert not caught.value.permanent and caught.value.status is None


def test_a_long_retry_after_goes_back_to_the_engine(vendor):
    vendor.mock.push(f.rate_limit(retry_after=600))
    with pytest.raises(ProviderError) as caught:
        call(vendor.provider())
    assert not caught.value.permanent and caught.value.retry_after == 600 and len(vendor.mock.model_requests()) == 1


# --- replies that are not final answers, and usage -------------------------------------------------------

def test_empty_reply_and_max_tokens_cut_are_reported(vendor, stream):
    vendor.mock.push(f.empty(), f.max_tokens("cut mid-sen"))
    empty, cut = call(vendor.provider(stream=stream)), call(vendor.provider(stream=stream))
    assert empty.empty and not empty.truncated
    assert cut.truncated and cut.finish_reason == "length" and cut.text == "cut mid-sen"


def test_a_reply_without_usage_is_estimated_never_zero(vendor, stream):
    vendor.mock.push(f.no_usage("an answer"))
    reply = call(vendor.provider(stream=stream))
    assert reply.usage.estimated and reply.usage.input > 0 and reply.usage.output > 0


def test_openai_cached_tokens_are_metered_apart():
    mock, v = _vendor("openai")
    try:
        big = [{"role": "user", "content": "x" * 8000}]
        provider = v.provider()
        first = provider.complete("SYS", big, TOOLS, should_stop=NEVER)
        second = provider.complete("SYS", big + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}],
                                   TOOLS, should_stop=NEVER)
        assert first.usage.cache_read == 0
        reported = mock.model_requests()[1].usage
        assert second.usage.cache_read == reported["prompt_tokens_details"]["cached_tokens"] >= 1024
        assert second.usage.input == reported["prompt_tokens"] - second.usage.cache_read
    finally:
        mock.stop()


def test_anthropic_cache_reads_the_previous_turns_prefix(stream):
    mock, v = _vendor("anthropic")
    try:
        tools = TOOLS * 40  # tool schemas: the bulk of every request, as in the real tool set
        provider = v.provider(stream=stream)
        history = [{"role": "user", "content": "start"}]
        first = provider.complete("SYS " * 200, history, tools, should_stop=NEVER)
        history += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "next"}]
        second = provider.complete("SYS " * 200, history, tools, should_stop=NEVER)
        assert first.usage.cache_read == 0 and first.usage.cache_write > 1024
        assert second.usage.cache_read >= first.usage.cache_write and second.usage.cache_write > 0
        assert second.usage.input < second.usage.cache_read / 10
    finally:
        mock.stop()


# --- cancel aborts the stream: the vendor sees the connection close and stops generating ---------------------

def _cancel_after(seconds: float):
    start = time.monotonic()
    return lambda: time.monotonic() - start > seconds


@pytest.mark.parametrize("behaviour", [f.generate(chunks=400, delay=0.05), f.hang(30)], ids=["mid-stream", "before-headers"])
def test_cancel_closes_the_connection_and_the_vendor_stops_generating(vendor, behaviour):
    vendor.mock.push(behaviour)
    provider = vendor.provider(timeout=30.0)
    assert provider.client is not None  # the SDK's first import is slow on a loaded machine: not part of the timing
    should_stop = _cancel_after(0.5)
    started = time.monotonic()
    with pytest.raises(Cancelled) as caught:
        call(provider, [], should_stop)
    cancelled_at = time.monotonic()
    if behaviour["kind"] == "generate":  # tokens generated before the hang-up are billed: an estimate rides along
        assert caught.value.usage.estimated and caught.value.usage.output > 0
    else:  # cut off before any output: nothing to bill, not an estimate of the request (issue 26.5)
        assert getattr(caught.value, "usage", None) is None
    assert cancelled_at - started < 1.5
    record = vendor.mock.model_requests()[0]
    deadline = time.monotonic() + 2
    while record.disconnected_at is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert record.disconnected_at is not None, "the vendor never saw the connection close"
    assert record.disconnected_at - cancelled_at < 2
    sent = record.chunks_sent
    time.sleep(0.3)
    assert record.chunks_sent == sent and sent < 50  # generation stopped at the disconnect


def test_cancel_during_backoff_does_not_wait_it_out(vendor):
    vendor.mock.push(f.rate_limit(retry_after=20))
    provider = vendor.provider()
    assert provider.client is not None
    started = time.monotonic()
    with pytest.raises(Cancelled):
        call(provider, [], _cancel_after(0.3))
    assert time.monotonic() - started < 1.5 and len(vendor.mock.model_requests()) == 1


def test_missing_key_is_a_clear_permanent_preflight_error(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ProviderError, match="ANTHROPIC_API_KEY is not set") as caught:
        AnthropicProvider.from_env("claude-x")
    assert caught.value.permanent


def test_the_offline_worker_does_not_count_a_refused_task_done_as_reported():
    """A task_done the ledger refused (the task was cancelled meanwhile) is neither retried nor
    reported as done: the worker's last word names it."""
    from veronica.agent.providers.offline import Trace, work

    brief = "### From leader — Task [task #7]\nYou are assigned task #7: Find TODO notes\n"
    trace = Trace([
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "task_done", "args": {"task_id": 7, "result": "x"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "error: task #7 is cancelled; it cannot be reported"},
    ])
    assert work(brief, trace, set()) == "Reported 0 task(s). Could not report task 7: task #7 is cancelled; it cannot be reported"
    trace.feed([
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c2", "name": "task_done", "args": {"task_id": 7, "result": "y"}}]},
        {"role": "tool", "tool_call_id": "c2", "content": "task #7 done"},
    ])
    assert work(brief, trace, set()) == "Reported 1 task(s)."


SSE_BODY = (b": comment\r\nevent: first\r\ndata: {\"a\": 1}\r\n\r\ndata: line one\rdata:line two\r\r"
            b"data\n\nevent: named-only\n\ndata: {\"b\": \"\xc3\xa9\"}\n\n\n\ndata: [DONE]\n\ndata: unfinished")


def test_server_sent_events_split_anywhere_read_as_the_sdks_decoder_reads_them():
    """sse.events against the OpenAI SDK's own decoder, on one body split at every byte (and in three
    pieces at every pair of bytes): the same events, names and data, whatever the split."""
    from openai._streaming import SSEDecoder

    from veronica.agent.providers import sse

    def reference(chunks):
        return [((e.event or "").encode(), e.data.encode()) for e in SSEDecoder().iter_bytes(iter(chunks))]

    expected = reference([SSE_BODY])
    assert [name for name, _ in expected] == [b"first", b"", b"", b"named-only", b"", b""]
    assert [data for _, data in expected][:3] == [b'{"a": 1}', b"line one\nline two", b""]
    for i in range(len(SSE_BODY) + 1):
        assert list(sse.events([SSE_BODY[:i], SSE_BODY[i:]])) == expected, i
    for i in range(0, len(SSE_BODY), 3):
        for j in range(i, len(SSE_BODY), 5):
            assert list(sse.events([SSE_BODY[:i], SSE_BODY[i:j], SSE_BODY[j:]])) == expected, (i, j)


def test_openai_stream_chunks_are_read_as_the_json_they_came_in():
    """Streamed chat-completion chunks are folded from their JSON objects (no SDK model per chunk): text,
    tool-call deltas by index across chunks, the finish reason and the usage with cached tokens; a chunk
    of the wrong shape is a malformed reply (retried), never a crash."""
    from veronica.agent.providers import sdk
    from veronica.agent.providers.openai_compat import StreamedReply

    acc = StreamedReply()
    assert acc.add({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}}]}) == "Hel"
    assert acc.add({"choices": [{"index": 0, "delta": {"content": "lo", "tool_calls": [
        {"index": 0, "id": "call_1", "type": "function", "function": {"name": "list_dir", "arguments": "{\"pa"}}]}}]}) == "lo"
    acc.add({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "th\": \".\"}"}}]},
                          "finish_reason": "tool_calls"}]})
    acc.add({"choices": [], "usage": {"prompt_tokens": 2000, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 1024}}})
    reply = acc.reply(10)
    assert reply.text == "Hello" and reply.finish_reason == "tool_calls"
    assert [(c.id, c.name, c.args) for c in reply.tool_calls] == [("call_1", "list_dir", {"path": "."})]
    assert (reply.usage.input, reply.usage.output, reply.usage.cache_read, reply.usage.estimated) == (976, 7, 1024, False)
    for bad in (["not", "an", "object"], {"choices": "x"}, {"choices": [{"delta": {"tool_calls": [7]}}]}, {"usage": 3}):
        with pytest.raises(sdk.Malformed):
            StreamedReply().add(bad)


# --- the worker's CPU per model call (issue 25: bench/model_call_cpu.py) ---------------------------------

def test_model_calls_reuse_their_call_thread():
    """A model call runs on a kept model-call thread, not one started per call (a third of a streamed
    call's CPU); still never on the caller's own thread (it relays text and polls should_stop)."""
    import threading

    from veronica.agent.providers import sdk

    ran = [sdk.run_attempt(lambda emit, aborted: threading.current_thread(), should_stop=NEVER, on_event=None,
                           streamed=[0]) for _ in range(3)]
    assert ran[0] is ran[1] is ran[2] and ran[0] is not threading.current_thread()


def test_an_aborted_calls_thread_serves_no_other_call_before_its_attempt_returns():
    """The caller of a cancelled call returns while its attempt still unwinds: the next call runs on
    another thread, and nothing the late attempt says reaches it."""
    import threading

    from veronica.agent.providers import sdk

    release, first = threading.Event(), {}

    def slow(emit, aborted):
        first["thread"] = threading.current_thread()
        release.wait(5)
        emit("late text")
        return "late"

    with pytest.raises(Cancelled):
        sdk.run_attempt(slow, should_stop=lambda: True, on_event=None, streamed=[0])
    events: list[dict] = []
    try:
        second = sdk.run_attempt(lambda emit, aborted: (emit("mine"), threading.current_thread())[1], should_stop=NEVER,
                                 on_event=events.append, streamed=[0])
    finally:
        release.set()
    assert second is not first["thread"]
    assert [e["delta"] for e in events] == ["mine"]


def test_a_late_abort_never_cuts_the_next_call_on_the_same_thread():
    """A cancel that lands after its call ended must not shut the socket of the call its kept thread
    serves by then (another run's): the abort checks, under the sockets' lock, whose call it is."""
    import queue
    import threading

    from veronica.agent.providers import sdk

    class Sock:
        shut = False

        def shutdown(self, how):
            self.shut = True

    class Stream:
        sock = Sock()

        def get_extra_info(self, name):
            return self.sock

    helper, stream, ready, go = sdk._take_helper(), Stream(), threading.Event(), threading.Event()

    def another_runs_call(emit, aborted):
        with sdk._IN_USE_LOCK:
            sdk._IN_USE[threading.get_ident()] = stream
        ready.set()
        go.wait(5)
        return "theirs"

    theirs = queue.SimpleQueue()
    helper.jobs.put((another_runs_call, theirs, threading.Event()))
    try:
        assert ready.wait(5)
        helper.abort(queue.SimpleQueue())  # the inbox of a call this thread served before
        assert not stream.sock.shut
        helper.abort(theirs)
        assert stream.sock.shut
    finally:
        go.set()
    assert theirs.get(timeout=5) == ("done", "theirs")


def test_a_forked_worker_starts_its_own_call_threads():
    """Kept call threads do not survive a fork (a q2 worker is forked from its cluster): the child
    must not hand its call to an idle thread of its parent's, which it does not have."""
    import os
    import threading

    from veronica.agent.providers import sdk

    sdk.run_attempt(lambda emit, aborted: None, should_stop=NEVER, on_event=None, streamed=[0])  # one idle here
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one call, its answer down the pipe, then out without pytest's teardown
        try:
            watchdog = threading.Timer(5, lambda: os._exit(3))
            watchdog.daemon = True
            watchdog.start()
            answer = sdk.run_attempt(lambda emit, aborted: "child ok", should_stop=NEVER, on_event=None, streamed=[0])
            os.write(write, answer.encode())
        finally:
            os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    assert os.read(read, 100) == b"child ok" and os.waitstatus_to_exitcode(status) == 0
    os.close(read)


def test_the_shard_clients_of_a_process_share_one_tls_context(settings):
    """Building a TLS context loads the CA bundle (20 ms of CPU): once per process, not per shard client,
    which each built one under the clients' lock in a pool's first burst of calls."""
    import threading

    from veronica.agent.providers import openai_compat

    settings.RUNS_PER_WORKER = 4 * 32  # four shards
    made = []

    def take() -> None:
        made.append(openai_compat.make_client("https://tls-context.test/v1", "k", 7.0))

    threads = [threading.Thread(target=take) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(client) for client in made}) == 4
    assert len({id(client._client._transport._pool._ssl_context) for client in made}) == 1


def test_the_openai_request_is_encoded_once(monkeypatch):
    """The streamed body is encoded once and sent as those bytes; the call's estimate is read off them,
    not from a second encoding of the messages and tools."""
    from veronica.agent.providers import sdk

    mock, v = _vendor("openai")
    try:
        monkeypatch.setattr(sdk, "estimate_tokens", lambda *a: pytest.fail("a second pass over the request"))
        mock.push(f.text("hi"))
        reply = call(v.provider())
        assert reply.text == "hi" and mock.model_requests()[0].body["messages"][1] == MESSAGES[0]
    finally:
        mock.stop()


def test_a_streamed_openai_call_sends_the_sdks_own_request_without_rebuilding_it(monkeypatch):
    """The request the SDK builds once per client is the one every streamed call sends (its headers, path
    and body as the SDK's post sends them), without the SDK's per-call request() and its rebuild."""
    from veronica.agent.providers import openai_compat

    mock, v = _vendor("openai")
    try:
        provider = v.provider()
        mock.push(f.text("by the SDK"))
        with monkeypatch.context() as m:
            m.setattr(openai_compat, "prepared", lambda client: None)  # the SDK's post, as before
            assert call(provider).text == "by the SDK"
        client = provider.client
        monkeypatch.setattr(type(client), "request", lambda *a, **k: pytest.fail("the SDK rebuilt the request"))
        for text in ("prepared", "prepared again"):
            mock.push(f.text(text))
            assert call(provider).text == text
        sdk_sent, *ours = mock.model_requests()
        for sent in ours:
            assert (sent.method, sent.path, sent.body) == (sdk_sent.method, sdk_sent.path, sdk_sent.body)
            assert sent.headers == sdk_sent.headers
        mock.push(f.status(403, "forbidden"))
        with pytest.raises(ProviderError, match="403") as failed:
            call(provider)
        assert failed.value.permanent
    finally:
        mock.stop()


def test_a_child_forked_while_a_parent_thread_holds_the_call_locks_still_makes_model_calls():
    """q2 forks workers: a lock another parent thread held at the fork stays held in the child for
    ever (nobody there releases it), so the child's first model call hung taking a helper."""
    import os
    import signal

    from veronica.agent.providers import sdk

    def attempt(emit, aborted):
        return 7

    with sdk._IDLE_LOCK, sdk._IN_USE_LOCK:  # as another thread may hold them at the fork
        pid = os.fork()
        if pid == 0:  # the child: a hang ends with SIGALRM
            signal.alarm(5)
            ok = False
            try:
                ok = sdk.run_attempt(attempt, should_stop=NEVER, on_event=None, streamed=[0]) == 7
            finally:
                os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child's model call hung or failed"


def test_a_forked_child_forgets_the_sockets_its_parent_s_calls_were_using():
    """A child thread may get the ident of a parent thread that was mid-call at the fork: an abort
    in the child then shut down the parent's socket (the same file, inherited) instead of nothing."""
    import os
    import signal

    from veronica.agent.providers import sdk

    with sdk._IN_USE_LOCK:
        sdk._IN_USE[12345] = object()  # a parent thread's call, in flight at the fork
    try:
        pid = os.fork()
        if pid == 0:
            signal.alarm(5)
            os._exit(0 if not sdk._IN_USE else 1)
    finally:
        with sdk._IN_USE_LOCK:
            sdk._IN_USE.pop(12345, None)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child still holds its parent's sockets"


# --- a pooled run's model call on its own thread (inline): stopped by the heartbeat's interrupt --------------

@pytest.fixture
def pushed():
    """This thread's stops are pushed to it (as a run of a beating run pool): its calls run inline."""
    from veronica.agent.providers import sdk

    sdk.interruptible(True, lambda: True)
    yield
    sdk.interruptible(False)


@pytest.mark.parametrize("behaviour", [f.generate(chunks=400, delay=0.05), f.hang(30)], ids=["mid-stream", "before-headers"])
def test_an_inline_call_ends_at_the_interrupt_and_the_vendor_sees_the_connection_close(vendor, behaviour, pushed, monkeypatch):
    """Nothing polls an inline call: the stop comes as sdk.interrupt from the heartbeat's thread, which shuts
    down the socket the run's thread is blocked on (before the headers or mid-stream); the streamed text
    reached on_event on the run's own thread, and no helper thread was used."""
    import threading

    from veronica.agent.providers import sdk

    monkeypatch.setattr(sdk, "_take_helper", lambda: (_ for _ in ()).throw(AssertionError("a helper was used")))
    vendor.mock.push(behaviour)
    provider = vendor.provider(timeout=30.0)
    assert provider.client is not None  # the SDK's first import is slow on a loaded machine: not part of the timing
    me, stop, seen, asked = threading.get_ident(), threading.Event(), [], []

    def on_event(event):
        seen.append(threading.get_ident())

    def heartbeat():
        time.sleep(0.5)
        asked.append(time.monotonic())
        stop.set()
        sdk.interrupt(me)

    threading.Thread(target=heartbeat, daemon=True).start()
    with pytest.raises(Cancelled) as caught:
        provider.complete("SYS", MESSAGES, TOOLS, should_stop=stop.is_set, on_event=on_event)
    cancelled_at = time.monotonic()
    assert asked and cancelled_at - asked[0] < 0.3, "the call outlived the interrupt"
    if behaviour["kind"] == "generate":
        assert seen and set(seen) == {me}, "the streamed text did not reach on_event on the run's thread"
        assert caught.value.usage.estimated and caught.value.usage.output > 0
    record = vendor.mock.model_requests()[0]
    deadline = time.monotonic() + 2
    while record.disconnected_at is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert record.disconnected_at is not None, "the vendor never saw the connection close"
    assert record.disconnected_at - cancelled_at < 1
    sent = record.chunks_sent
    time.sleep(0.3)
    assert record.chunks_sent == sent and sent < 50
    assert not sdk.calling(me) and me not in sdk._IN_USE and me not in sdk._STOPPED


def test_an_inline_call_stopped_by_its_sink_ends_at_the_next_text(vendor, pushed):
    """A stop the run finds itself (the live sink's fence lost the lease) ends an inline call at the next
    streamed text, not at the end of the answer: nothing else polls it."""
    vendor.mock.push(f.generate(chunks=400, delay=0.02))
    provider = vendor.provider(timeout=30.0)
    assert provider.client is not None
    texts = []
    with pytest.raises(Cancelled):
        provider.complete("SYS", MESSAGES, TOOLS, should_stop=lambda: len(texts) >= 3, on_event=texts.append)
    record = vendor.mock.model_requests()[0]
    deadline = time.monotonic() + 2
    while record.disconnected_at is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(texts) == 3 and record.disconnected_at is not None and record.chunks_sent < 50


def test_an_interrupt_between_two_socket_operations_fails_the_next_one(pushed):
    """An interrupt that lands while the inline call is not blocked on its socket (between two reads,
    relaying text) is not lost: the thread's next read fails, its socket shut down; the call raises
    Cancelled. Once the call is over, an interrupt cuts nothing (the thread's next request is another's)."""
    import threading

    from veronica.agent.providers import sdk

    class Sock:
        shut = 0

        def shutdown(self, how):
            self.shut += 1

    class Inner:
        def __init__(self):
            self.sock = Sock()

        def read(self, max_bytes, timeout=None):
            return b"x"

        def get_extra_info(self, name):
            return self.sock

    me, inner = threading.get_ident(), Inner()
    stream = sdk._TrackedStream(inner)

    def attempt(emit, aborted):
        stream.read(10)  # this call's socket, marked
        sdk.interrupt(me)  # as the heartbeat would, from its thread, while this one relays text
        assert inner.sock.shut == 1
        stream.read(10)  # fails: the stop is not lost
        return "never"

    with pytest.raises(Cancelled):
        sdk.run_attempt(attempt, should_stop=NEVER, on_event=None, streamed=[0])
    assert inner.sock.shut == 2
    later = Inner()
    assert sdk.run_attempt(lambda emit, aborted: sdk._TrackedStream(later).read(1), should_stop=NEVER, on_event=None,
                           streamed=[0]) == b"x"
    sdk._TrackedStream(later).read(1)  # a request after the call (not a model call's)
    sdk.interrupt(me)
    assert later.sock.shut == 0 and me not in sdk._STOPPED
    with sdk._IN_USE_LOCK:
        sdk._IN_USE.pop(me, None)
