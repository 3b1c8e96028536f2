"""The mock vendors run as a separate process too (for real-cluster tests on other hosts), scripted
and read over HTTP."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.vendors import faults as f
from veronica.agent.providers.anthropic import AnthropicProvider
from veronica.agent.providers.base import ProviderError
from veronica.agent.providers.openai_compat import OpenAIProvider
from veronica.agent.providers.sdk import CallConfig

REPO = Path(__file__).resolve().parent.parent.parent


def post(url: str, payload) -> dict:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def get(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


@pytest.mark.parametrize("module,provider_cls,suffix", [("mock_openai", OpenAIProvider, "/v1"), ("mock_anthropic", AnthropicProvider, "")])
def test_a_mock_vendor_as_a_separate_process(module, provider_cls, suffix):
    proc = subprocess.Popen([sys.executable, "-m", f"tests.vendors.{module}", "--port", "0", "--key", "k-proc",
                             "--script", json.dumps([f.unauthorized()])], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        root = proc.stdout.readline().strip()
        assert root.startswith("http://127.0.0.1:")
        provider = provider_cls("m", root + suffix, "k-proc", CallConfig(timeout=5, max_retries=1, backoff=0.01))
        with pytest.raises(ProviderError) as caught:  # the script given on the command line
            provider.complete("S", [{"role": "user", "content": "hi"}], [], should_stop=lambda: False)
        assert caught.value.status == 401
        post(root + "/_mock/script", [f.status(500), f.text("from another process")])
        reply = provider.complete("S", [{"role": "user", "content": "hi"}], [], should_stop=lambda: False)
        assert reply.text == "from another process"
        rows = get(root + "/_mock/requests")
        assert [r["behaviour"]["kind"] for r in rows] == ["status", "status", "text"]
        post(root + "/_mock/reset", {})
        assert get(root + "/_mock/requests") == []
    finally:
        proc.terminate()
        proc.wait(timeout=5)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_a_lean_mock_reads_requests_like_the_standard_one(stream):
    """Lean mode (the fleet bench) reads request headers without http.server's parser: the key, the body
    length, keep-alive, a 404, and a scripted conversation of steps all read as they do otherwise."""
    from tests.vendors.mock_openai import MockOpenAI

    mock = MockOpenAI(api_key="k-lean").configure(steps=2, lean=True).start()
    try:
        provider = OpenAIProvider("m", mock.base_url, "k-lean", CallConfig(timeout=5, max_retries=0, stream=stream))
        messages = [{"role": "user", "content": "list it é " * 50}]
        reply = provider.complete("S", messages, [], should_stop=lambda: False)
        assert [c.name for c in reply.tool_calls] == ["list_dir"]
        messages += [{"role": "assistant", "content": "", "tool_calls": [{"id": reply.tool_calls[0].id, "name": "list_dir",
                                                                          "args": {"path": "."}}]},
                     {"role": "tool", "tool_call_id": reply.tool_calls[0].id, "content": "a.py"}]
        assert provider.complete("S", messages, [], should_stop=lambda: False).text == "done"
        wrong = OpenAIProvider("m", mock.base_url, "k-wrong", CallConfig(timeout=5, max_retries=0, stream=stream))
        with pytest.raises(ProviderError) as caught:
            wrong.complete("S", messages, [], should_stop=lambda: False)
        assert caught.value.status == 401
        doubled = OpenAIProvider("m", mock.base_url + "/v1", "k-lean", CallConfig(timeout=5, max_retries=0, stream=stream))
        with pytest.raises(ProviderError) as caught:
            doubled.complete("S", messages, [], should_stop=lambda: False)
        assert caught.value.status == 404
        assert mock.served == 2 and mock.requests == []  # lean: model answers counted, nothing recorded
    finally:
        mock.stop()


def test_a_streamed_reply_on_a_kept_alive_connection_is_not_held_back():
    """The mock writes an event stream as a vendor's server does, with TCP_NODELAY: without it, on a
    reused connection each small write after the first waited for the client's delayed ACK (~40 ms a
    call, read by the fleet bench as the engine's time)."""
    from tests.vendors.mock_openai import MockOpenAI

    mock = MockOpenAI(api_key="k").configure(steps=3, lean=True).start()
    try:
        provider = OpenAIProvider("m", mock.base_url, "k", CallConfig(timeout=5, max_retries=0, stream=True))
        walls = []
        for _ in range(15):
            started = time.monotonic()
            provider.complete("S", [{"role": "user", "content": "hi"}], [], should_stop=lambda: False)
            walls.append(time.monotonic() - started)
        assert sorted(walls)[len(walls) // 2] < 0.03, walls
    finally:
        mock.stop()
