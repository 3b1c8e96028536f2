"""Anthropic Messages API with tools, through the official `anthropic` SDK. ANTHROPIC_API_KEY;
ANTHROPIC_BASE_URL for proxies and tests (the host only: the SDK adds `/v1/messages`).

Prompt caching: the prompt is hashed in the order tools → system → messages, so `cache_control`
sits on the last tool (the tool schemas, most of every request), on the system block (persona,
skills, rules: stable for a run and across runs) and on the last block of the conversation (each
turn then reads the transcript so far from the cache and writes only what is new).
"""
from __future__ import annotations

import os
import threading

from veronica.agent.providers import sdk
from veronica.agent.providers.base import ProviderError, Reply, ToolCall, Usage

DEFAULT_BASE_URL = "https://api.anthropic.com"
CACHE = {"type": "ephemeral"}
FINISH = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls", "max_tokens": "length",
          "model_context_window_exceeded": "length", "refusal": "content_filter"}


def endpoint_from_env() -> tuple[str, str]:
    from django.conf import settings

    return (settings.ANTHROPIC_BASE_URL or DEFAULT_BASE_URL).rstrip("/"), os.environ.get("ANTHROPIC_API_KEY", "")


def make_client(base_url: str, api_key: str, timeout: float):
    import anthropic

    return sdk.shared(("anthropic", base_url, api_key), lambda http: anthropic.Anthropic(
        api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout, http_client=http), timeout)


class AnthropicProvider:
    vendor = "anthropic"

    def __init__(self, model: str, base_url: str, api_key: str, cfg: sdk.CallConfig | None = None) -> None:
        self.model, self.base_url, self.api_key = model, base_url.rstrip("/"), api_key
        self.cfg = cfg or sdk.CallConfig.from_settings()
        self.label = f"anthropic:{model}"

    @classmethod
    def from_env(cls, model: str, api_key: str | None = None) -> "AnthropicProvider":
        base, key = endpoint_from_env()
        key = api_key or key
        if not key:
            raise ProviderError("ANTHROPIC_API_KEY is not set", permanent=True)
        return cls(model, base, key)

    @property
    def client(self):
        return make_client(self.base_url, self.api_key, self.cfg.timeout)

    def request_body(self, system: str, messages: list[dict], tools: list[dict]) -> dict:
        wire: list[dict] = []

        def push(role: str, block: dict) -> None:
            if wire and wire[-1]["role"] == role:
                wire[-1]["content"].append(block)
            else:
                wire.append({"role": role, "content": [block]})

        for m in messages:
            if m["role"] == "assistant":
                if (m.get("content") or "").strip():  # the API refuses a blank text block ("\n\n" before a tool_use)
                    push("assistant", {"type": "text", "text": m["content"]})
                for c in m.get("tool_calls") or []:
                    push("assistant", {"type": "tool_use", "id": c["id"], "name": c["name"], "input": c["args"]})
            elif m["role"] == "tool":
                push("user", {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]})
            else:
                push("user", {"type": "text", "text": m["content"]})
        if wire:
            wire[-1]["content"][-1] = {**wire[-1]["content"][-1], "cache_control": CACHE}
        body = {"model": self.model, "max_tokens": self.cfg.max_tokens, "messages": wire}
        if system:  # the API refuses an empty text block
            body["system"] = [{"type": "text", "text": system, "cache_control": CACHE}]
        if tools:
            body["tools"] = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]} for t in tools]
            body["tools"][-1]["cache_control"] = CACHE
        return body

    def complete(self, system: str, messages: list[dict], tools: list[dict], *, should_stop, on_event=None) -> Reply:
        body = self.request_body(system, messages, tools)
        estimate = sdk.estimate_tokens(system, body["messages"], body.get("tools") or [])
        client = self.client

        def attempt(emit, aborted: threading.Event) -> Reply:
            if not self.cfg.stream:
                return self.parse(client.messages.create(**body), estimate)
            try:
                with client.messages.stream(**body) as stream:  # leaving the block closes the response
                    for event in stream:
                        if aborted.is_set():
                            return Reply()
                        if event.type == "text" and event.text:
                            emit(event.text)
                    message = stream.get_final_message()
            except (AssertionError, ValueError) as exc:
                # The SDK's stream accumulator asserts on a body that is no event stream (an HTML page, an
                # empty stream) and its JSON parser raises ValueError on a lone-surrogate escape in a
                # tool's input: both are a malformed response (retried), not a crash of the run.
                raise sdk.Malformed(f"unreadable event stream ({type(exc).__name__}: {str(exc)[:200]})") from exc
            if getattr(message, "stop_reason", None) is None:  # no message_delta / message_stop: cut mid-answer
                raise sdk.Malformed("the event stream ended before the message did (no stop_reason)")
            return self.parse(message, estimate)

        return sdk.call(attempt, vendor="anthropic", cfg=self.cfg, should_stop=should_stop, on_event=on_event,
                        input_estimate=estimate)

    def parse(self, message, estimate: int) -> Reply:
        content = getattr(message, "content", None)
        if content is None or getattr(message, "type", "message") != "message":
            raise sdk.Malformed(f"not a message: {str(message)[:200]}")
        text, calls = [], []
        for block in content:
            if block.type == "text":
                text.append(block.text or "")
            elif block.type == "tool_use":
                calls.append(ToolCall(id=block.id, name=block.name, args=block.input if isinstance(block.input, dict) else {}))
        joined = "\n".join(t for t in text if t)
        return Reply(text=joined, tool_calls=calls, finish_reason=FINISH.get(message.stop_reason or "", ""),
                     usage=usage_of(getattr(message, "usage", None), estimate, joined, calls))


def usage_of(usage, estimate: int, text: str, calls: list[ToolCall]) -> Usage:
    """input_tokens excludes the cache: read and written prefix tokens are reported (and priced) apart."""
    read = getattr(usage, "cache_read_input_tokens", None) or 0
    written = getattr(usage, "cache_creation_input_tokens", None) or 0
    uncached = getattr(usage, "input_tokens", None) or 0
    if usage is None or uncached + read + written <= 0:
        out = sdk.estimate_tokens(text, [c.args for c in calls]) if (text or calls) else 1
        return Usage(input=estimate, output=out, estimated=True)
    return Usage(input=uncached, output=getattr(usage, "output_tokens", 0) or 0, cache_read=read, cache_write=written)
