"""A mock OpenAI chat-completions server (the wire format vLLM, Ollama, llama.cpp and LiteLLM share).

Routes: POST /v1/chat/completions (JSON or SSE when `stream: true`), GET /v1/models; anything else
is a 404 (so a doubled `/v1` is caught). Auth: `Authorization: Bearer <api_key>`.
Prompt caching is automatic, as at OpenAI: the longest prefix shared with an earlier request, from
1,024 tokens up in steps of 128, is reported as `prompt_tokens_details.cached_tokens`.

Run standalone: `python -m tests.vendors.mock_openai --port 8400 --key sk-test` (prints the URL; the
base URL for clients is that URL + "/v1"; script it over HTTP at /_mock/script, read /_mock/requests).
"""
from __future__ import annotations

import json
import time
import uuid

from tests.vendors.faults import Handler, MockVendor, Record, serve_main, tokens


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class MockOpenAI(MockVendor):
    dialect = "openai"
    MIN_CACHE_TOKENS = 1024

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.prompts: list[str] = []

    @property
    def base_url(self) -> str:
        return self.root + "/v1"

    def authorized(self, headers) -> bool:
        return headers.get("authorization") == f"Bearer {self.api_key}"

    def route(self, method: str, path: str) -> str | None:
        if method == "POST" and path == "/v1/chat/completions":
            return "model"
        if method == "GET" and path == "/v1/models":
            return "models"
        return None

    def request_id_header(self) -> str:
        return "x-request-id"

    def models_body(self) -> dict:
        return {"object": "list", "data": [{"id": "gpt-mock", "object": "model", "created": 0, "owned_by": "mock"}]}

    def error_body(self, status: int, message: str, overflow: bool = False) -> dict:
        if overflow:
            return {"error": {"message": "This model's maximum context length is 128000 tokens. However, your messages "
                                         "resulted in 131072 tokens.", "type": "invalid_request_error", "param": "messages",
                              "code": "context_length_exceeded"}}
        kind = {401: "invalid_request_error", 404: "invalid_request_error", 429: "rate_limit_exceeded"}.get(status, "server_error")
        return {"error": {"message": message, "type": kind, "param": None, "code": None}}

    # --- usage ------------------------------------------------------------------------------------
    def usage_for(self, body: dict, completion: str) -> dict:
        prompt = json.dumps({"tools": body.get("tools"), "messages": body.get("messages")}, sort_keys=True)
        prompt_tokens = tokens(prompt)
        shared = max((_common_prefix(prompt, earlier) for earlier in self.prompts), default=0) // 4
        cached = (shared // 128) * 128 if shared >= self.MIN_CACHE_TOKENS else 0
        if not self.lean:  # a long bench would compare each prompt with every earlier one
            self.prompts.append(prompt)
        out = tokens(completion) if completion else 1
        return {"prompt_tokens": prompt_tokens, "completion_tokens": out, "total_tokens": prompt_tokens + out,
                "prompt_tokens_details": {"cached_tokens": cached}}

    # --- answers ------------------------------------------------------------------------------------
    def answer(self, handler: Handler, record: Record, behaviour: dict) -> None:
        body = record.body or {}
        kind = behaviour["kind"]
        content, calls, finish = "", [], "stop"
        if kind == "text":
            content = behaviour["text"]
        elif kind == "tool_call":
            content = behaviour.get("text", "")
            calls = [{"id": f"call_{uuid.uuid4().hex[:10]}", "type": "function",
                      "function": {"name": behaviour["name"], "arguments": json.dumps(behaviour["args"])}}]
            finish = "tool_calls"
        elif kind == "cut":
            content = behaviour["text"]
            calls = [{"id": c.get("id") or f"call_{i}", "type": "function", "function": {"name": c["name"], "arguments": c.get("arguments", "{}")}}
                     for i, c in enumerate(behaviour["calls"])]
        elif kind == "raw_calls":
            content = behaviour.get("text", "")
            calls = [{"id": c.get("id"), "type": "function",
                      "function": {"name": c["name"], "arguments": c.get("arguments", "{}")}} for c in behaviour["calls"]]
            finish = behaviour.get("finish") or "tool_calls"
        elif kind == "max_tokens":
            content, finish = behaviour["text"], "length"
        elif kind == "generate":
            content = "".join(f"token{i} " for i in range(behaviour["chunks"]))
        usage = self.usage_for(body, content + json.dumps([c["function"] for c in calls]) if calls else content)
        usage.update(behaviour.get("usage_override") or {})
        record.usage = usage
        with_usage = behaviour.get("usage", True)
        if not body.get("stream"):
            message = {"role": "assistant", "content": content or None}
            if calls:
                message["tool_calls"] = calls
            payload = {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
                       "model": body.get("model", ""), "choices": [{"index": 0, "message": message, "finish_reason": finish}]}
            if with_usage:
                payload["usage"] = usage
            return handler.send_json(200, payload)
        self.stream(handler, record, behaviour, content, calls, finish, usage if with_usage else None)

    def stream(self, handler: Handler, record: Record, behaviour: dict, content: str, calls: list, finish: str,
               usage: dict | None) -> None:
        body = record.body or {}
        base = {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion.chunk", "created": int(time.time()),
                "model": body.get("model", "")}

        def chunk(delta: dict, finish_reason=None) -> str:
            return json.dumps({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]})

        handler.start_stream()
        handler.send_event(record, chunk({"role": "assistant", "content": ""}))
        if behaviour["kind"] == "generate":
            for i in range(behaviour["chunks"]):
                handler.pause(record, behaviour["delay"])
                handler.send_event(record, chunk({"content": f"token{i} "}))
        elif behaviour["kind"] == "malformed":
            for i in range(behaviour.get("stream_after", 0)):
                handler.send_event(record, chunk({"content": f"part{i} "}))
            handler.send_event(record, '{"id": "broken", "choices": [{"delta": ')
            handler.end_stream()
            return
        elif behaviour["kind"] == "stream_error":
            for i in range(behaviour.get("after", 1)):
                handler.send_event(record, chunk({"content": f"part{i} "}))
            handler.send_event(record, json.dumps({"error": {"message": "The server is overloaded", "type": "server_error",
                                                             "param": None, "code": None}}))
            handler.end_stream()
            return
        else:
            pieces = max(int(behaviour.get("chunks", 1)), 1)
            step = max(len(content) // pieces, 1)
            for start in range(0, len(content), step):
                handler.pause(record, behaviour.get("delay", 0.0))
                handler.send_event(record, chunk({"content": content[start:start + step]}))
        for index, call in enumerate(calls):
            args = call["function"]["arguments"]
            half = len(args) // 2
            handler.send_event(record, chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                                               "function": {"name": call["function"]["name"], "arguments": ""}}]}))
            for part in (args[:half], args[half:]):
                handler.send_event(record, chunk({"tool_calls": [{"index": index, "function": {"arguments": part}}]}))
        if behaviour["kind"] == "cut":
            handler.end_stream()
            return
        handler.send_event(record, chunk({}, finish))
        if usage is not None and (body.get("stream_options") or {}).get("include_usage"):
            handler.send_event(record, json.dumps({**base, "choices": [], "usage": usage}))
        handler.send_event(record, "[DONE]")
        handler.end_stream()


if __name__ == "__main__":
    serve_main(MockOpenAI)
