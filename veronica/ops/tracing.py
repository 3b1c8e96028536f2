"""OpenTelemetry traces: a run is a trace, each model call and tool call a span, with the GenAI
semantic-convention attributes; waggle replays and approvals are span events.

Off unless the standard OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) variable is set: then
`configure()` (called at start-up) installs an SDK TracerProvider exporting over OTLP/HTTP, which
reads the other standard OTEL_* variables itself (headers, protocol path, service name). When off,
every helper here returns after one `is None` check: no spans, no context, no cost."""
from __future__ import annotations

import functools
import os
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from veronica.plumbing.secret_store import mask

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
TRACED_EVENTS = {"approval.requested", "approval.decided", "waggle.replayed"}
SYSTEMS = {"openai": "openai", "anthropic": "anthropic"}  # gen_ai.provider.name well-known values

_tracer: trace.Tracer | None = None


def configure(provider: Any = None) -> bool:
    """Install tracing. With no provider: only when an OTLP endpoint is configured. Tests pass an
    SDK TracerProvider with an in-memory exporter; `configure(None)` with no endpoint turns it off."""
    global _tracer
    if provider is None:
        if not any(os.environ.get(var) for var in ENDPOINT_VARS):
            _tracer = None
            return False
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "veronica"}
        provider = TracerProvider(resource=Resource.create(attributes))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))  # a thread; re-made after a fork
        trace.set_tracer_provider(provider)
    _tracer = provider.get_tracer("veronica")
    return True


def enabled() -> bool:
    return _tracer is not None


# --- a run --------------------------------------------------------------------------------------------------

def start_run(member, run, source: str):
    """Open the run's root span and make it current for this thread; pass the result to end_run."""
    if _tracer is None:
        return None
    span = _tracer.start_span(f"invoke_agent {member.name}", context=otel_context.Context(), attributes={
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": member.name, "gen_ai.agent.id": str(member.pk),
        "veronica.space": member.space.slug if getattr(member, "space", None) else str(member.space_id),
        "veronica.run.id": run.pk, "veronica.run.source": source, "gen_ai.request.model": member.model,
    })
    return span, otel_context.attach(trace.set_span_in_context(span))


def end_run(handle, outcome: str, error: str = "") -> None:
    if handle is None:
        return
    span, token = handle
    span.set_attribute("veronica.run.outcome", outcome)
    if error:
        span.set_status(Status(StatusCode.ERROR, mask(error)[:300]))
    span.end()
    otel_context.detach(token)


# --- a model call ---------------------------------------------------------------------------------------------

def complete(provider, spec: str, *args, **kwargs):
    """`provider.complete(*args, **kwargs)` inside a `chat {model}` span."""
    if _tracer is None:
        return provider.complete(*args, **kwargs)
    kind, _, model = (spec or "").partition(":")
    system = SYSTEMS.get(kind.strip(), kind.strip() or "unknown")
    model = model.strip() or kind.strip()
    with _tracer.start_as_current_span(f"chat {model}", kind=SpanKind.CLIENT, attributes={
        "gen_ai.operation.name": "chat", "gen_ai.system": system, "gen_ai.provider.name": system,
        "gen_ai.request.model": model,
    }) as span:
        reply = provider.complete(*args, **kwargs)
        usage = reply.usage
        span.set_attributes({
            "gen_ai.usage.input_tokens": usage.input, "gen_ai.usage.output_tokens": usage.output,
            "gen_ai.usage.cache_read.input_tokens": usage.cache_read,
            "gen_ai.usage.cache_creation.input_tokens": usage.cache_write,
            "gen_ai.response.finish_reasons": [reply.finish_reason] if reply.finish_reason else [],
            "veronica.usage.estimated": bool(usage.estimated), "veronica.reply.tool_calls": len(reply.tool_calls),
        })
        used = getattr(reply, "model", "") or ""
        if used and used != spec:  # a fallback answered: the span says which model did, and which one failed
            span.set_attributes({"gen_ai.response.model": used.partition(":")[2] or used, "veronica.model.fallback": used,
                                 "veronica.model.fallback_from": spec})
        return reply


# --- a tool call ----------------------------------------------------------------------------------------------

def traced_tool(fn):
    """Decorates `run_tool(tool, tctx, args) -> str`: an `execute_tool {name}` span per call; a
    result that starts with 'error:' marks the span failed."""
    @functools.wraps(fn)
    def wrapper(tool, tctx, args, **kwargs):
        if _tracer is None:
            return fn(tool, tctx, args, **kwargs)
        with _tracer.start_as_current_span(f"execute_tool {tool.name}", kind=SpanKind.INTERNAL, attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool.name,
            "gen_ai.tool.type": "extension" if tool.name.startswith("mcp__") else "function",
            "veronica.tool.mutates": tool.mutates,
        }, record_exception=False, set_status_on_exception=False) as span:
            try:
                result = fn(tool, tctx, args, **kwargs)
            except BaseException as exc:  # a wait for the operator unwinds through here; it is no failure
                span.add_event("tool.suspended", {"reason": type(exc).__name__})
                raise
            if isinstance(result, str) and result.startswith("error:"):
                span.set_status(Status(StatusCode.ERROR, mask(result)[:300]))
            span.set_attribute("veronica.tool.result_chars", len(result) if isinstance(result, str) else 0)
            return result
    return wrapper


# --- events ---------------------------------------------------------------------------------------------------

def event(name: str, **attributes) -> None:
    """An event on the current span (the run, or the tool call it happens in), if one is recording."""
    if _tracer is None:
        return
    span = trace.get_current_span()
    if span.is_recording():
        span.add_event(name, {k: mask(v) if isinstance(v, str) else v if isinstance(v, (bool, int, float)) else mask(str(v))
                              for k, v in attributes.items()})


def on_emit(kind: str, payload: dict) -> None:
    """events.emit's hook: the kinds worth seeing in a trace become span events."""
    if _tracer is not None and kind in TRACED_EVENTS:
        event(kind, **{k: v for k, v in payload.items() if k not in ("args", "member_name")})

