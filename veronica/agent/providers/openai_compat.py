"""Any OpenAI-compatible chat-completions endpoint with tool calling (OpenAI, vLLM, Ollama,
llama.cpp server, LiteLLM proxy). Configured by OPENAI_BASE_URL and OPENAI_API_KEY."""
from __future__ import annotations

import json
import os

from veronica.agent.providers.base import ProviderError, Reply, ToolCall, Usage
from veronica.agent.providers.http import post_json


class OpenAIProvider:
    def __init__(self, model: str, base_url: str, api_key: str, timeout: float = 120.0) -> None:
        self.model, self.base_url, self.api_key, self.timeout = model, base_url.rstrip("/"), api_key, timeout
        self.backoff = float(os.environ.get("VERONICA_MODEL_BACKOFF", "1.0"))
        self.label = f"openai:{model}"

    @classmethod
    def from_env(cls, model: str) -> "OpenAIProvider":
        base = os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1")
        key = os.environ.get("OPENAI_API_KEY", "")
        if not key and "api.openai.com" in base:
            raise ProviderError("OPENAI_API_KEY is not set (needed for api.openai.com; local servers may leave it empty)")
        return cls(model, base, key, float(os.environ.get("VERONICA_MODEL_TIMEOUT", "120")))

    def request_body(self, system: str, messages: list[dict], tools: list[dict]) -> dict:
        wire = [{"role": "system", "content": system}]
        for m in messages:
            if m["role"] == "assistant":
                item = {"role": "assistant", "content": m.get("content") or None}
                if m.get("tool_calls"):
                    item["tool_calls"] = [{"id": c["id"], "type": "function",
                                           "function": {"name": c["name"], "arguments": json.dumps(c["args"])}} for c in m["tool_calls"]]
                wire.append(item)
            elif m["role"] == "tool":
                wire.append({"role": "tool", "tool_call_id": m["tool_call_id"], "content": m["content"]})
            else:
                wire.append({"role": "user", "content": m["content"]})
        body = {"model": self.model, "messages": wire}
        if tools:
            body["tools"] = [{"type": "function", "function": t} for t in tools]
        return body

    def parse(self, payload: dict) -> Reply:
        try:
            message = payload["choices"][0]["message"]
        except (KeyError, IndexError, TypeError):
            raise ProviderError(f"unexpected response shape: {str(payload)[:300]}") from None
        calls = []
        for raw in message.get("tool_calls") or []:
            fn = raw.get("function", {})
            try:
                args = json.loads(fn.get("arguments") or "{}")
            except json.JSONDecodeError:
                args = {"_unparsed": fn.get("arguments", "")}
            calls.append(ToolCall(id=raw.get("id") or f"call_{len(calls)}", name=fn.get("name", ""), args=args if isinstance(args, dict) else {}))
        usage = payload.get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0
        return Reply(text=message.get("content") or "", tool_calls=calls,
                     usage=Usage(input=(usage.get("prompt_tokens") or 0) - cached, output=usage.get("completion_tokens") or 0,
                                 cache_read=cached))

    def complete(self, system: str, messages: list[dict], tools: list[dict], *, should_stop) -> Reply:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        payload = post_json(f"{self.base_url}/chat/completions", headers, self.request_body(system, messages, tools),
                            should_stop=should_stop, timeout=self.timeout, backoff=self.backoff)
        return self.parse(payload)
