"""Wire format over real HTTP against a local server (no client patching)."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from veronica.agent.providers.anthropic import AnthropicProvider
from veronica.agent.providers.base import Cancelled, ProviderError
from veronica.agent.providers.openai_compat import OpenAIProvider

MESSAGES = [
    {"role": "user", "content": "list the files"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "t1", "name": "list_dir", "args": {"path": "."}}]},
    {"role": "tool", "tool_call_id": "t1", "name": "list_dir", "content": "a.py"},
]
TOOLS = [{"name": "list_dir", "description": "List", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": []}}]


class Server:
    def __init__(self):
        self.requests, self.script = [], []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((self.path, dict(self.headers), body))
                status, payload, delay = outer.script.pop(0) if outer.script else (500, {}, 0)
                time.sleep(delay)
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    if status == 429:
                        self.send_header("Retry-After", "0")
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def server():
    srv = Server()
    yield srv
    srv.httpd.shutdown()


OPENAI_REPLY = {"choices": [{"message": {"content": None, "tool_calls": [
    {"id": "call_9", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\": \"a.py\"}"}}]}}],
    "usage": {"prompt_tokens": 120, "completion_tokens": 15, "prompt_tokens_details": {"cached_tokens": 20}}}
ANTHROPIC_REPLY = {"content": [{"type": "text", "text": "Reading."}, {"type": "tool_use", "id": "tu_1", "name": "read_file",
                                                                       "input": {"path": "a.py"}}],
                   "usage": {"input_tokens": 90, "output_tokens": 12, "cache_read_input_tokens": 30}}


def test_openai_wire_format_and_usage(server):
    server.script = [(200, OPENAI_REPLY, 0)]
    reply = OpenAIProvider("gpt-test", server.url, "sk-1").complete("SYS", MESSAGES, TOOLS, should_stop=lambda: False)
    path, headers, body = server.requests[0]
    assert path == "/chat/completions" and headers["Authorization"] == "Bearer sk-1"
    assert body["model"] == "gpt-test" and body["messages"][0] == {"role": "system", "content": "SYS"}
    assert body["messages"][2]["tool_calls"][0]["function"] == {"name": "list_dir", "arguments": "{\"path\": \".\"}"}
    assert body["messages"][3] == {"role": "tool", "tool_call_id": "t1", "content": "a.py"}
    assert body["tools"][0]["type"] == "function" and body["tools"][0]["function"]["name"] == "list_dir"
    assert reply.tool_calls[0].name == "read_file" and reply.tool_calls[0].args == {"path": "a.py"}
    assert (reply.usage.input, reply.usage.output, reply.usage.cache_read) == (100, 15, 20)


def test_anthropic_wire_format_and_usage(server):
    server.script = [(200, ANTHROPIC_REPLY, 0)]
    reply = AnthropicProvider("claude-test", server.url, "ak-1").complete("SYS", MESSAGES, TOOLS, should_stop=lambda: False)
    path, headers, body = server.requests[0]
    assert path == "/v1/messages" and headers["x-api-key"] == "ak-1" and headers["anthropic-version"]
    assert body["system"] == "SYS" and body["tools"][0]["input_schema"]["type"] == "object"
    assert body["messages"][1] == {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "list_dir", "input": {"path": "."}}]}
    assert body["messages"][2]["content"][0] == {"type": "tool_result", "tool_use_id": "t1", "content": "a.py"}
    assert reply.text == "Reading." and reply.tool_calls[0].args == {"path": "a.py"}
    assert (reply.usage.input, reply.usage.output, reply.usage.cache_read) == (90, 12, 30)


def test_retries_429_and_5xx_then_succeeds(server):
    server.script = [(429, {"error": "slow down"}, 0), (503, {"error": "busy"}, 0), (200, OPENAI_REPLY, 0)]
    provider = OpenAIProvider("m", server.url, "k")
    provider.backoff = 0.01
    assert provider.complete("S", MESSAGES, TOOLS, should_stop=lambda: False).tool_calls
    assert len(server.requests) == 3


def test_a_client_error_is_not_retried(server):
    server.script = [(400, {"error": "bad tool schema"}, 0)]
    with pytest.raises(ProviderError, match="HTTP 400"):
        AnthropicProvider("m", server.url, "k").complete("S", MESSAGES, TOOLS, should_stop=lambda: False)
    assert len(server.requests) == 1


def test_a_model_call_in_flight_is_aborted_by_cancel(server):
    server.script = [(200, OPENAI_REPLY, 5)]
    started = time.monotonic()
    with pytest.raises(Cancelled):
        OpenAIProvider("m", server.url, "k").complete("S", MESSAGES, TOOLS, should_stop=lambda: time.monotonic() - started > 0.3)
    assert time.monotonic() - started < 2


def test_missing_key_is_a_clear_preflight_error(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ProviderError, match="ANTHROPIC_API_KEY is not set"):
        AnthropicProvider.from_env("claude-x")
