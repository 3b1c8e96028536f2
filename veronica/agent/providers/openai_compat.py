"""Any OpenAI-compatible chat-completions endpoint with tool calling (OpenAI, vLLM, Ollama, llama.cpp
server, LiteLLM proxy), through the official `openai` SDK. OPENAI_BASE_URL and OPENAI_API_KEY.

Streamed by default (text reaches the console as it is generated; `stream_options.include_usage`
asks for the usage chunk). Tool-call deltas are accumulated here rather than by the SDK's
`.stream()` helper, which raises on `finish_reason: length` instead of returning the cut reply.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import uuid
import weakref

from veronica.agent.providers import sdk, sse
from veronica.agent.providers.base import ProviderError, Reply, ToolCall, Usage

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.openai.com/v1"
FINISH = {"stop": "stop", "tool_calls": "tool_calls", "function_call": "tool_calls", "length": "length",
          "content_filter": "content_filter"}


def endpoint_from_env() -> tuple[str, str]:
    from django.conf import settings

    return (settings.OPENAI_BASE_URL or DEFAULT_BASE_URL).rstrip("/"), os.environ.get("OPENAI_API_KEY", "")


def make_client(base_url: str, api_key: str, timeout: float):
    import openai

    # local servers take no key, but the SDK insists on one
    return sdk.shared(("openai", base_url, api_key), lambda http: openai.OpenAI(
        api_key=api_key or "no-key", base_url=base_url, max_retries=0, timeout=timeout, http_client=http), timeout)


class OpenAIProvider:
    vendor = "openai"

    def __init__(self, model: str, base_url: str, api_key: str, cfg: sdk.CallConfig | None = None) -> None:
        self.model, self.base_url, self.api_key = model, base_url.rstrip("/"), api_key
        self.cfg = cfg or sdk.CallConfig.from_settings()
        self.label = f"openai:{model}"

    @classmethod
    def from_env(cls, model: str, api_key: str | None = None) -> "OpenAIProvider":
        base, key = endpoint_from_env()
        key = api_key or key
        if not key and "api.openai.com" in base:
            raise ProviderError("OPENAI_API_KEY is not set (needed for api.openai.com; local servers may leave it empty)",
                                permanent=True)
        return cls(model, base, key)

    @property
    def client(self):
        return make_client(self.base_url, self.api_key, self.cfg.timeout)

    def request_body(self, system: str, messages: list[dict], tools: list[dict]) -> dict:
        wire = [{"role": "system", "content": system}]
        for m in messages:
            if m["role"] == "assistant":
                if not m.get("content") and not m.get("tool_calls"):
                    continue  # e.g. a turn whose only call was cut at the token limit: the API refuses it empty
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

    def complete(self, system: str, messages: list[dict], tools: list[dict], *, should_stop, on_event=None) -> Reply:
        body = self.request_body(system, messages, tools)
        streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
        # Encoded once, here: the SDK sends these bytes as they are (`content=`), and the estimate (chars
        # / 4 of what is sent) is read off their length instead of encoding messages and tools again.
        payload = sdk.json_body(streamed)
        estimate = sdk.estimate_of(payload)
        client = self.client

        # The body goes as extra_body, the SDK's own pass-through: create() otherwise walks every
        # message and tool schema against its TypedDict annotations (its `maybe_transform`), a third of
        # a call's CPU in the SDK (bench/fleet.py: 500 runs in two workers were CPU-bound) for a body
        # that is plain JSON already. The JSON sent is the same.
        wire = {"model": body["model"], "messages": [], "extra_body": {k: v for k, v in body.items() if k != "model"}}

        def attempt(emit, aborted: threading.Event) -> Reply:
            if not self.cfg.stream:
                return self.parse(client.chat.completions.create(**wire), estimate)
            # Through the SDK's own post (auth, base URL, HTTP errors mapped to its exceptions), but the
            # body is read here: each event's JSON becomes a dict, never a model object per chunk, and
            # the body is read to its end, so the connection goes back to the pool (the SDK's stream
            # closed it at [DONE] unread: a new connection per call).
            response = stream_post(client, payload)
            acc = StreamedReply()
            try:
                body = sdk.body_chunks(response, openai_sdk())
                for _, data in sse.events(body):
                    if aborted.is_set():
                        break
                    if data.startswith(b"[DONE]"):
                        sdk.drain(body, sse.DRAIN_SECONDS)
                        break
                    delta = acc.add(chunk_of(data, response))
                    if delta:
                        emit(delta)
            finally:
                response.close()
            return acc.reply(estimate)

        return sdk.call(attempt, vendor="openai", cfg=self.cfg, should_stop=should_stop, on_event=on_event,
                        input_estimate=estimate)

    def parse(self, completion, estimate: int) -> Reply:
        choices = getattr(completion, "choices", None)
        if not choices or getattr(choices[0], "message", None) is None:
            raise sdk.Malformed(f"no choices in the reply: {str(completion)[:200]}")
        message = choices[0].message
        calls = [tool_call(c.id, c.function.name, c.function.arguments) for c in (message.tool_calls or [])
                 if getattr(c, "function", None) is not None]
        text = message.content or ""
        return Reply(text=text, tool_calls=calls, finish_reason=FINISH.get(choices[0].finish_reason or "", ""),
                     usage=usage_of(completion.usage, estimate, text, calls))


STREAM_OPTIONS = {"security": {"bearer_auth": True}}  # what chat.completions.create sends with its request

# The SDK's request for a streamed call, built by the SDK once per client: (url, headers, extensions).
# Its request() rebuilt it on every call (options copied twice, headers, URL and query merged, the
# httpx request built through the client's merges): a quarter of a model call's CPU in a pooled worker
# (bench/fleet_profile.py --profile), for the same URL and headers every time. None: a client whose
# requests differ per call (a key provider, workload identity, a provider runtime, an idempotency
# header, a custom auth) goes through client.post as before.
_prepared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_PER_CALL = ("_api_key_provider", "_workload_identity_auth", "_provider_runtime", "_idempotency_header")


def prepared(client):
    try:
        return _prepared[client]
    except KeyError:
        pass
    template = None
    try:
        from openai._models import FinalRequestOptions

        if not any(getattr(client, name, None) is not None for name in _PER_CALL) and client._custom_auth(
                STREAM_OPTIONS["security"]) is None:
            options = client._prepare_options(FinalRequestOptions.construct(method="post", url="/chat/completions",
                                                                            content=b"", **STREAM_OPTIONS))
            request = client._build_request(options)
            client._prepare_request(request)
            headers = request.headers.copy()
            headers.pop("content-length", None)  # set per call from its body
            template = (request.url, headers, dict(request.extensions))
    except Exception:  # noqa: BLE001 - an SDK whose internals moved: its own post() still works
        log.debug("no prepared request for this client; each call goes through the SDK's post", exc_info=True)
    _prepared[client] = template
    return template


def stream_post(client, payload: bytes):
    """POST the streamed call as the SDK's request() would (the same request, its errors mapped the same:
    APITimeoutError, APIConnectionError, the status error of a response that is not a success), the
    request built from the client's prepared one; the response is returned unread."""
    template = prepared(client)
    if template is None:
        return client.post("/chat/completions", content=payload, cast_to=http_response(), options=STREAM_OPTIONS, stream=True)
    import httpx2
    from openai import APIConnectionError, APITimeoutError, OpenAIError
    from openai._httpx2 import request_exceptions, timeout_exceptions

    url, headers, extensions = template
    request = httpx2.Request("POST", url, headers=headers, content=payload, extensions=dict(extensions))
    try:
        response = client._send_request(request, stream=True)
    except timeout_exceptions() as exc:
        raise APITimeoutError(request=request) from exc
    except OpenAIError:
        raise
    except request_exceptions() as exc:
        raise APIConnectionError(request=request) from exc
    if not response.is_success:
        if not response.is_closed:
            response.read()
        raise client._make_status_error_from_response(response) from None
    return response


def openai_sdk():
    import openai

    return openai


def http_response():
    import httpx2

    return httpx2.Response  # the SDK hands back the response itself, unread


def chunk_of(data: bytes, response):
    """One event's JSON; an error object inside the 200 stream is raised as the SDK's stream raises it."""
    try:
        chunk = json.loads(data)
    except UnicodeDecodeError as exc:
        raise sdk.Malformed(f"a stream event that is not UTF-8 ({exc})") from None
    if isinstance(chunk, dict) and chunk.get("error"):
        error = chunk["error"]
        message = error.get("message") if isinstance(error, dict) else None
        raise openai_sdk().APIError(message if isinstance(message, str) and message else "An error occurred during streaming",
                                    request=response.request, body=error)
    return chunk


class StreamedReply:
    """Chat-completion chunks (the JSON objects of the SSE stream) folded into one reply: text, tool
    calls by index, finish reason, usage. A field of the wrong type is a malformed chunk (retried)."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: dict[int, dict] = {}
        self.finish = ""
        self.usage = None
        self.chunks = 0

    def add(self, chunk) -> str:
        if not isinstance(chunk, dict):
            raise sdk.Malformed(f"a stream chunk that is not an object: {str(chunk)[:200]}")
        self.chunks += 1
        try:
            return self._add(chunk)
        except (AttributeError, TypeError, KeyError) as exc:
            raise sdk.Malformed(f"a stream chunk of an unexpected shape ({exc}): {str(chunk)[:200]}") from None

    def _add(self, chunk: dict) -> str:
        if chunk.get("usage") is not None:
            self.usage = Fields(chunk["usage"])
        choices = chunk.get("choices") or []
        if not choices:
            return ""
        choice = choices[0]
        if choice.get("finish_reason"):
            self.finish = choice["finish_reason"]
        delta = choice.get("delta")
        if delta is None:
            return ""
        for part in delta.get("tool_calls") or []:
            index = part.get("index")
            slot = self.calls.setdefault(index if index is not None else len(self.calls), {"id": "", "name": "", "arguments": ""})
            slot["id"] = part.get("id") or slot["id"]
            function = part.get("function")
            if function is not None:
                slot["name"] = function.get("name") or slot["name"]
                slot["arguments"] += function.get("arguments") or ""
        content = delta.get("content")
        if content:
            self.text.append(content)
            return content
        return ""

    def reply(self, estimate: int) -> Reply:
        if not self.chunks:
            raise sdk.Malformed("the stream ended without a single chunk")
        if not self.finish:  # cut mid-answer (no finish_reason): half an answer is no final answer
            raise sdk.Malformed("the stream ended before its finish_reason")
        calls = [tool_call(c["id"], c["name"], c["arguments"]) for _, c in sorted(self.calls.items())]
        text = "".join(self.text)
        return Reply(text=text, tool_calls=calls, finish_reason=FINISH.get(self.finish, ""),
                     usage=usage_of(self.usage, estimate, text, calls))


class Fields:
    """A JSON object read like the SDK's model of it (usage_of reads attributes): a missing key is None."""

    def __init__(self, data) -> None:
        if not isinstance(data, dict):
            raise TypeError(f"usage is a {type(data).__name__}, not an object")
        self._data = data

    def __getattr__(self, name: str):
        value = self._data.get(name)
        return Fields(value) if isinstance(value, dict) else value


def tool_call(call_id: str | None, name: str | None, arguments: str | None) -> ToolCall:
    try:
        args = json.loads(arguments or "{}")
    except (json.JSONDecodeError, RecursionError):
        args = None
    if not isinstance(args, dict):  # cut, garbage, an array, a string, null: the loop answers with an error
        args = {"_unparsed": arguments or ""}
    # A server that sends no id gets a unique one (never call_<index>: the next reply would reuse it).
    return ToolCall(id=call_id or f"call_{uuid.uuid4().hex[:24]}", name=name or "", args=args)


def usage_of(usage, estimate: int, text: str, calls: list[ToolCall]) -> Usage:
    """prompt_tokens includes the cached ones: input is the uncached rest. No usage -> an estimate."""
    prompt = getattr(usage, "prompt_tokens", None) or 0
    if usage is None or prompt <= 0:
        out = sdk.estimate_tokens(text, [c.args for c in calls]) if (text or calls) else 1
        return Usage(input=estimate, output=out, estimated=True)
    details = getattr(usage, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) or 0
    written = getattr(details, "cache_write_tokens", None) or 0
    return Usage(input=max(prompt - cached - written, 0), output=getattr(usage, "completion_tokens", 0) or 0,
                 cache_read=cached, cache_write=written)
