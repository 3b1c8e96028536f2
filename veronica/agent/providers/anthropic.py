"""Anthropic Messages API with tools. ANTHROPIC_API_KEY; ANTHROPIC_BASE_URL for proxies/tests."""
from __future__ import annotations

import os

from veronica.agent.providers.base import ProviderError, Reply, ToolCall, Usage
from veronica.agent.providers.http import post_json

API_VERSION = "2023-06-01"


class AnthropicProvider:
    def __init__(self, model: str, base_url: str, api_key: str, max_tokens: int = 4096, timeout: float = 120.0) -> None:
        self.model, self.base_url, self.api_key = model, base_url.rstrip("/"), api_key
        self.max_tokens, self.timeout = max_tokens, timeout
        self.backoff = float(os.environ.get("VERONICA_MODEL_BACKOFF", "1.0"))
        self.label = f"anthropic:{model}"

    @classmethod
    def from_env(cls, model: str) -> "AnthropicProvider":
        key = os.environ.get("ANTHROPIC_API_KEY", "")
        if not key:
            raise ProviderError("ANTHROPIC_API_KEY is not set")
        return cls(model, os.environ.get("ANTHROPIC_BASE_URL", "https://api.anthropic.com"), key,
                   int(os.environ.get("VERONICA_MAX_TOKENS", "4096")), float(os.environ.get("VERONICA_MODEL_TIMEOUT", "120")))

    def request_body(self, system: str, messages: list[dict], tools: list[dict]) -> dict:
        wire: list[dict] = []

        def push(role: str, block: dict) -> None:
            if wire and wire[-1]["role"] == role:
                wire[-1]["content"].append(block)
            else:
                wire.append({"role": role, "content": [block]})

        for m in messages:
            if m["role"] == "assistant":
                if m.get("content"):
                    push("assistant", {"type": "text", "text": m["content"]})
                for c in m.get("tool_calls") or []:
                    push("assistant", {"type": "tool_use", "id": c["id"], "name": c["name"], "input": c["args"]})
            elif m["role"] == "tool":
                push("user", {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]})
            else:
                push("user", {"type": "text", "text": m["content"]})
        body = {"model": self.model, "max_tokens": self.max_tokens, "system": system, "messages": wire}
        if tools:
            body["tools"] = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]} for t in tools]
        return body

    def parse(self, payload: dict) -> Reply:
        if not isinstance(payload, dict) or "content" not in payload:
            raise ProviderError(f"unexpected response shape: {str(payload)[:300]}")
        text, calls = [], []
        for block in payload["content"]:
            if block.get("type") == "text":
                text.append(block.get("text", ""))
            elif block.get("type") == "tool_use":
                calls.append(ToolCall(id=block["id"], name=block["name"], args=block.get("input") or {}))
        usage = payload.get("usage") or {}
        return Reply(text="\n".join(text), tool_calls=calls,
                     usage=Usage(input=usage.get("input_tokens", 0), output=usage.get("output_tokens", 0),
                                 cache_read=usage.get("cache_read_input_tokens", 0) or 0,
                                 cache_write=usage.get("cache_creation_input_tokens", 0) or 0))

    def complete(self, system: str, messages: list[dict], tools: list[dict], *, should_stop) -> Reply:
        headers = {"x-api-key": self.api_key, "anthropic-version": API_VERSION, "content-type": "application/json"}
        payload = post_json(f"{self.base_url}/v1/messages", headers, self.request_body(system, messages, tools),
                            should_stop=should_stop, timeout=self.timeout, backoff=self.backoff)
        return self.parse(payload)
