"""The mock vendors run as a separate process too (for real-cluster tests on other hosts), scripted
and read over HTTP."""
from __future__ import annotations

import json
import subprocess
import sys
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
