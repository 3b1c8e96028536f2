"""A mock Anthropic Messages API server.

Routes: POST /v1/messages (JSON, or SSE events when `stream: true`), GET /v1/models; anything else is
a 404 (so a base URL ending in `/v1`, which the SDK doubles, is caught). Auth: `x-api-key` or a bearer token.

Prompt caching is simulated the way the API documents it: the prompt is the sequence tools →
system → messages, blocks carrying `cache_control` are breakpoints; a breakpoint's prefix (from
`min_cache_tokens` up) is written to the cache and later requests read the longest cached prefix
that ends at one of their breakpoints or up to 20 blocks before one. Usage reports
`cache_read_input_tokens`, `cache_creation_input_tokens` and the uncached rest as `input_tokens`.

Run standalone: `python -m tests.vendors.mock_anthropic --port 8401 --key ak-test` (prints the base URL).
"""
from __future__ import annotations

import hashlib
import json
import uuid

from tests.vendors.faults import Handler, MockVendor, Record, serve_main, tokens

LOOKBACK = 20


def prompt_blocks(body: dict) -> list[dict]:
    """The cacheable prompt in the order the API hashes it: tools, then system, then message blocks."""
    blocks = [dict(t, _part="tool") for t in body.get("tools") or []]
    system = body.get("system")
    if isinstance(system, str) and system:
        blocks.append({"type": "text", "text": system, "_part": "system"})
    elif isinstance(system, list):
        blocks.extend(dict(b, _part="system") for b in system)
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        blocks.extend(dict(b, _role=message.get("role")) for b in content or [])
    return blocks


class MockAnthropic(MockVendor):
    dialect = "anthropic"

    def __init__(self, *args, min_cache_tokens: int = 1024, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.min_cache_tokens = min_cache_tokens
        self.cache: dict[str, int] = {}  # prefix hash -> tokens

    @property
    def base_url(self) -> str:
        return self.root

    def authorized(self, headers) -> bool:
        # the API takes `x-api-key`; SDK 2.x sends `Authorization: Bearer`: both are accepted
        return self.api_key in (headers.get("x-api-key"), headers.get("authorization", "").removeprefix("Bearer "))

    def route(self, method: str, path: str) -> str | None:
        if method == "POST" and path == "/v1/messages":
            return "model"
        if method == "GET" and path == "/v1/models":
            return "models"
        return None

    def request_id_header(self) -> str:
        return "request-id"

    def models_body(self) -> dict:
        return {"data": [{"type": "model", "id": "claude-mock", "display_name": "Mock", "created_at": "2025-01-01T00:00:00Z"}],
                "has_more": False, "first_id": "claude-mock", "last_id": "claude-mock"}

    def error_body(self, status: int, message: str, overflow: bool = False) -> dict:
        if overflow:
            return {"type": "error", "error": {"type": "invalid_request_error",
                                               "message": "prompt is too long: 210000 tokens > 200000 maximum"}}
        kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                429: "rate_limit_error", 529: "overloaded_error"}.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}

    # --- caching ----------------------------------------------------------------------------------
    def usage_for(self, body: dict, completion: str) -> dict:
        blocks = prompt_blocks(body)
        keys, sizes, running = [], [], hashlib.sha256()
        total = 0
        for block in blocks:
            clean = {k: v for k, v in block.items() if k != "cache_control"}
            running.update(json.dumps(clean, sort_keys=True).encode())
            keys.append(running.copy().hexdigest())
            total += tokens(clean)
            sizes.append(total)
        breakpoints = [i for i, b in enumerate(blocks) if b.get("cache_control")]
        read = 0
        for bp in breakpoints:
            for i in range(bp, max(bp - LOOKBACK, -1), -1):
                if keys[i] in self.cache:
                    read = max(read, sizes[i])
                    break
        written = 0
        for bp in breakpoints:
            if sizes[bp] >= self.min_cache_tokens and keys[bp] not in self.cache:
                self.cache[keys[bp]] = sizes[bp]
                written = max(written, sizes[bp] - read)
        uncached = max(total - read - written, 0)
        return {"input_tokens": uncached, "output_tokens": tokens(completion) if completion else 1,
                "cache_read_input_tokens": read, "cache_creation_input_tokens": written}

    # --- answers ------------------------------------------------------------------------------------
    def answer(self, handler: Handler, record: Record, behaviour: dict) -> None:
        body = record.body or {}
        kind = behaviour["kind"]
        blocks: list[dict] = []
        stop = "end_turn"
        if kind in ("text", "max_tokens") and behaviour["text"]:
            blocks.append({"type": "text", "text": behaviour["text"]})
        if kind == "max_tokens":
            stop = "max_tokens"
        if kind == "tool_call":
            if behaviour.get("text"):
                blocks.append({"type": "text", "text": behaviour["text"]})
            blocks.append({"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:12]}", "name": behaviour["name"],
                           "input": behaviour["args"]})
            stop = "tool_use"
        if kind == "cut":
            blocks.append({"type": "text", "text": behaviour["text"]})
        if kind == "raw_calls":
            if behaviour.get("text"):
                blocks.append({"type": "text", "text": behaviour["text"]})
            for c in behaviour["calls"]:
                blocks.append({"type": "tool_use", "id": c.get("id"), "name": c["name"], "input": c.get("input", {})})
            stop = behaviour.get("finish") or "tool_use"
        if kind == "generate":
            blocks.append({"type": "text", "text": "".join(f"token{i} " for i in range(behaviour["chunks"]))})
        usage = self.usage_for(body, json.dumps(blocks) if blocks else "")
        usage.update(behaviour.get("usage_override") or {})
        record.usage = usage
        with_usage = behaviour.get("usage", True)
        message = {"id": f"msg_{uuid.uuid4().hex[:12]}", "type": "message", "role": "assistant", "model": body.get("model", ""),
                   "content": blocks, "stop_reason": stop, "stop_sequence": None}
        if not body.get("stream"):
            if with_usage:
                message["usage"] = usage
            return handler.send_json(200, message)
        self.stream(handler, record, behaviour, message, usage if with_usage else None)

    def stream(self, handler: Handler, record: Record, behaviour: dict, message: dict, usage: dict | None) -> None:
        def send(event: str, data: dict | str) -> None:
            handler.send_event(record, data if isinstance(data, str) else json.dumps(data), event)

        start_usage = dict(usage or {"input_tokens": 0}, output_tokens=1)
        handler.start_stream()
        send("message_start", {"type": "message_start", "message": dict(message, content=[], stop_reason=None, usage=start_usage)})
        if behaviour["kind"] == "malformed":
            for i in range(behaviour.get("stream_after", 0)):
                if i == 0:
                    send("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
                send("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": f"part{i} "}})
            send("content_block_delta", '{"type": "content_block_delta", "index": 0, "delta": {')
            handler.end_stream()
            return
        if behaviour["kind"] == "stream_error":
            send("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
            for i in range(behaviour.get("after", 1)):
                send("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": f"part{i} "}})
            send("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
            handler.end_stream()
            return
        send("ping", {"type": "ping"})
        for index, block in enumerate(message["content"]):
            if block["type"] == "text":
                send("content_block_start", {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}})
                if behaviour["kind"] == "generate":
                    for i in range(behaviour["chunks"]):
                        handler.pause(record, behaviour["delay"])
                        send("content_block_delta", {"type": "content_block_delta", "index": index,
                                                     "delta": {"type": "text_delta", "text": f"token{i} "}})
                else:
                    pieces = max(int(behaviour.get("chunks", 1)), 1)
                    step = max(len(block["text"]) // pieces, 1)
                    for s in range(0, len(block["text"]), step):
                        handler.pause(record, behaviour.get("delay", 0.0))
                        send("content_block_delta", {"type": "content_block_delta", "index": index,
                                                     "delta": {"type": "text_delta", "text": block["text"][s:s + step]}})
            else:
                send("content_block_start", {"type": "content_block_start", "index": index,
                                             "content_block": {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}})
                args = json.dumps(block["input"])
                half = len(args) // 2
                for part in (args[:half], args[half:]):
                    send("content_block_delta", {"type": "content_block_delta", "index": index,
                                                 "delta": {"type": "input_json_delta", "partial_json": part}})
            send("content_block_stop", {"type": "content_block_stop", "index": index})
        if behaviour["kind"] == "cut":
            handler.end_stream()
            return
        delta_usage = {"output_tokens": usage["output_tokens"]} if usage else {"output_tokens": 0}
        send("message_delta", {"type": "message_delta", "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                               "usage": delta_usage})
        send("message_stop", {"type": "message_stop"})
        handler.end_stream()


if __name__ == "__main__":
    serve_main(MockAnthropic)
