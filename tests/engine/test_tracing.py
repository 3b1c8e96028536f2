"""OpenTelemetry traces, read back through the SDK's in-memory exporter: a run is a trace, model
and tool calls are spans with GenAI attributes, approvals and waggle replays are events."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from veronica.swarm import bus
from veronica.ops import tracing
from veronica.agent.providers.base import Reply, ToolCall, Usage
from veronica.engine import approvals, runner, supervisor
from veronica.models import Approval, Member


@pytest.fixture
def spans(monkeypatch):
    for var in tracing.ENDPOINT_VARS:
        monkeypatch.delenv(var, raising=False)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.configure(provider)
    yield exporter
    tracing.configure()  # no endpoint: off again


class VendorLike:
    """A provider whose replies carry what real vendors report: cached tokens, finish reasons."""

    def __init__(self, *steps):
        self.steps = list(steps)

    def complete(self, system, messages, tools, *, should_stop, on_event=None):
        step = self.steps.pop(0) if self.steps else "done"
        usage = Usage(input=1200, output=80, cache_read=1000, cache_write=64)
        if isinstance(step, str):
            return Reply(text=step, usage=usage, finish_reason="stop")
        return Reply(tool_calls=[ToolCall(id=f"c{len(self.steps)}", name=step[0], args=step[1])], usage=usage,
                     finish_reason="tool_calls")


@pytest.fixture
def vendor(monkeypatch):
    def install(*steps):
        provider = VendorLike(*steps)
        monkeypatch.setattr("veronica.agent.loop.get_provider", lambda spec: provider)
        return provider
    return install


def w1_of(space):
    member = supervisor.get_member(space, "w1")
    Member.objects.filter(pk=member.pk).update(model="anthropic:claude-sonnet-4-5")
    member.refresh_from_db()
    return member


def by_name(exporter):
    return {s.name: s for s in exporter.get_finished_spans()}


def test_a_run_is_one_trace_with_a_span_per_model_call_and_tool_call(space, spans, vendor, tmp_path):
    (tmp_path / "alpha" / "notes.txt").write_text("hello\n")
    vendor(("read_file", {"path": "notes.txt"}), ("read_file", {"path": "missing.txt"}), "All read.")
    w1 = w1_of(space)
    bus.send(space, "boss", "w1", "read notes.txt")
    assert runner.wake(w1.pk, "message") == "done"
    finished = spans.get_finished_spans()
    run = next(s for s in finished if s.name == "invoke_agent w1")
    assert run.parent is None and len({s.context.trace_id for s in finished}) == 1
    assert run.attributes["veronica.run.outcome"] == "done" and run.attributes["veronica.run.source"] == "message"
    assert run.attributes["veronica.space"] == "alpha" and run.attributes["gen_ai.agent.name"] == "w1"
    chats = [s for s in finished if s.name == "chat claude-sonnet-4-5"]
    assert len(chats) == 3 and all(s.parent.span_id == run.context.span_id for s in chats)
    chat = chats[0].attributes
    assert chat["gen_ai.system"] == "anthropic" and chat["gen_ai.provider.name"] == "anthropic"
    assert chat["gen_ai.request.model"] == "claude-sonnet-4-5" and chat["gen_ai.operation.name"] == "chat"
    assert (chat["gen_ai.usage.input_tokens"], chat["gen_ai.usage.output_tokens"]) == (1200, 80)
    assert chat["gen_ai.usage.cache_read.input_tokens"] == 1000 and chat["gen_ai.usage.cache_creation.input_tokens"] == 64
    assert chat["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert chats[-1].attributes["gen_ai.response.finish_reasons"] == ("stop",)
    tools = [s for s in finished if s.name == "execute_tool read_file"]
    assert len(tools) == 2 and all(s.parent.span_id == run.context.span_id for s in tools)
    assert tools[0].attributes["gen_ai.tool.name"] == "read_file" and tools[0].attributes["gen_ai.operation.name"] == "execute_tool"
    assert tools[0].status.status_code != StatusCode.ERROR and tools[1].status.status_code == StatusCode.ERROR


def test_approvals_are_events_on_the_runs_traces(space, spans, vendor, tmp_path, django_user_model):
    operator = django_user_model.objects.create_user("op")
    vendor(("write_file", {"path": "out.txt", "content": "x"}), "written")
    w1 = supervisor.set_permission_mode(w1_of(space), "default", actor="op")
    bus.send(space, "boss", "w1", "write it")
    assert runner.wake(w1.pk, "message") == "waiting"
    held = by_name(spans)["invoke_agent w1"]
    assert held.attributes["veronica.run.outcome"] == "waiting"
    assert [e.name for e in held.events] == ["approval.requested"] and held.events[0].attributes["tool"] == "write_file"
    spans.clear()
    approvals.decide(Approval.objects.get(), approve=True, user=operator)
    assert runner.wake(w1.pk, "resume") == "done"
    resumed = by_name(spans)["invoke_agent w1"]
    resolved = [e for e in resumed.events if e.name == "approval.resolved"]
    assert resolved and resolved[0].attributes["status"] == "approved"
    assert by_name(spans)["execute_tool write_file"].parent.span_id == resumed.context.span_id


def test_waggle_replays_are_events(db, spans, demo_manifest):
    from tests.engine.test_self_improvement import _round
    from veronica.portable.manifest import register

    space = register(demo_manifest)
    _round(space)
    _round(space)
    assert space.events.filter(kind="waggle.replayed").exists()
    replayed = [e for s in spans.get_finished_spans() for e in s.events if e.name == "waggle.replayed"]
    assert replayed and replayed[0].attributes["after"]


def test_tracing_is_off_without_an_endpoint_and_costs_no_spans(space, vendor, monkeypatch):
    for var in tracing.ENDPOINT_VARS:
        monkeypatch.delenv(var, raising=False)
    assert tracing.configure() is False and not tracing.enabled()
    provider = vendor("ok")
    assert tracing.complete(provider, "openai:gpt-4o", "sys", [], [], should_stop=lambda: False).text == "ok"
    assert tracing.start_run(w1_of(space), None, "message") is None


class _Collector(BaseHTTPRequestHandler):
    bodies: list[tuple[str, bytes]] = []

    def do_POST(self):  # noqa: N802 - the stdlib's name
        length = int(self.headers.get("Content-Length", 0))
        _Collector.bodies.append((self.path, self.rfile.read(length)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_the_endpoint_variable_exports_over_otlp_http(space, vendor, monkeypatch):
    from opentelemetry import trace

    collector = HTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{collector.server_port}")
    try:
        assert tracing.configure() is True
        vendor("ok")
        bus.send(space, "boss", "w1", "hi")
        runner.wake(w1_of(space).pk, "message")
        trace.get_tracer_provider().force_flush()
        paths = [path for path, _ in _Collector.bodies]
        assert "/v1/traces" in paths
        body = b"".join(b for _, b in _Collector.bodies)
        assert b"invoke_agent w1" in body and b"chat claude-sonnet-4-5" in body and b"veronica" in body
    finally:
        monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
        tracing.configure()
        trace.get_tracer_provider().shutdown()  # the global provider outlives the test: nothing more may reach it
        collector.shutdown()
