"""The workers' side of the model gateway's wire (veronica.agent.providers.gateway_client): the official
SDK's calls over a real gateway process to the mock vendor. Connections to the gateway are kept alive
and reused; one the gateway closed (it went away, or was started again) costs a new connection, not the
call; no gateway at all sends the call straight to the vendor. And the answer's body comes out of the
gateway's Framing unframed, however its bytes are split."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.vendors import faults as f
from tests.vendors.mock_openai import MockOpenAI
from veronica.agent.providers import gateway, gateway_client, sdk
from veronica.agent.providers.openai_compat import OpenAIProvider
from veronica.agent.providers.sdk import CallConfig

MESSAGES = [{"role": "user", "content": "list the files"}]
NEVER = lambda: False  # noqa: E731


@pytest.fixture
def mock():
    vendor = MockOpenAI(api_key="sk-wire").start()
    yield vendor
    vendor.stop()


@pytest.fixture
def socket_path(monkeypatch, tmp_path):
    """Where this test's gateways listen; the SDK clients made from here go through it."""
    tmp_path.chmod(0o700)
    path = str(tmp_path / "socket")
    monkeypatch.setenv(gateway.SOCKET_ENV, path)
    monkeypatch.setattr(sdk, "_CLIENTS", {})
    return path


@pytest.fixture
def opened(monkeypatch):
    """The connections the transport opened to the gateway (count)."""
    count = [0]
    connect = gateway_client.GatewayTransport._connect

    def counted(self, seconds):
        conn = connect(self, seconds)
        count[0] += 1
        return conn

    monkeypatch.setattr(gateway_client.GatewayTransport, "_connect", counted)
    return count


def start_gateway(path: str) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-m", "veronica.agent.providers.gateway", path], stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not gateway.answers(path):
        assert time.monotonic() < deadline and process.poll() is None, "the gateway did not start"
        time.sleep(0.02)
    return process


def end(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    process.wait(10)


def call(mock, stream: bool = True) -> str:
    cfg = CallConfig(timeout=20.0, max_retries=0, backoff=0.01, stream=stream, max_tokens=256)
    with sdk.call_scope("member:1"):
        return OpenAIProvider("model-x", mock.base_url, "sk-wire", cfg).complete("SYS", MESSAGES, [], should_stop=NEVER).text


def test_calls_reuse_one_kept_alive_connection(socket_path, opened, mock):
    relay = start_gateway(socket_path)
    try:
        for n, stream in enumerate([True, False, True, False]):
            mock.push(f.text(f"answer {n}"))
            assert call(mock, stream) == f"answer {n}"
    finally:
        end(relay)
    assert opened[0] == 1
    assert len(mock.model_requests()) == 4


def test_a_kept_alive_connection_the_gateway_closed_costs_a_new_connection_not_the_call(socket_path, opened, mock):
    relay = start_gateway(socket_path)
    mock.push(f.text("before"), f.text("after"))
    try:
        assert call(mock) == "before"
        end(relay)  # its connection, kept alive in the worker, is closed with it
        relay = start_gateway(socket_path)  # (the same host's next gateway)
        assert call(mock) == "after"
    finally:
        end(relay)
    assert opened[0] == 2
    assert len(mock.model_requests()) == 2  # the call was made once


def test_with_its_gateway_gone_a_worker_calls_the_vendor_directly(socket_path, opened, mock):
    relay = start_gateway(socket_path)
    mock.push(f.text("via the gateway"), f.text("direct"))
    assert call(mock) == "via the gateway"
    end(relay)
    assert call(mock) == "direct"
    assert len(mock.model_requests()) == 2


def framed(kind: str, body: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Request-Id: r1\r\n"
    if kind == "chunked":
        chunks = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(part), part) for part in (body[:7], body[7:8], body[8:]) if part)
        return b"HTTP/1.1 100 Continue\r\n\r\n" + head + b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\nTrailer: x\r\n\r\n"
    if kind == "length":
        return head + b"Content-Length: %d\r\n\r\n" % len(body) + body
    return head + b"Connection: close\r\n\r\n" + body


@pytest.mark.parametrize("kind", ["chunked", "length", "until-close"])
@pytest.mark.parametrize("split", [1, 3, 4096])
def test_the_framing_unframes_an_answer_however_its_bytes_are_split(kind, split):
    body = b'data: {"choices": [{"delta": {"content": "hi\\r\\n"}}]}\n\ndata: [DONE]\n\n'
    wire = framed(kind, body)
    frame = gateway.Framing(decode=True)
    states = [frame.feed(wire[at:at + split]) for at in range(0, len(wire), split)]
    assert states[-1] == ("more" if kind == "until-close" else "done") and "error" not in states
    assert b"".join(frame.payload) == body
    assert frame.status == 200 and frame.reason == b"OK"
    assert (b"X-Request-Id", b"r1") in frame.fields  # the fields as sent, for the SDK's response
    assert frame.keep_alive == (kind != "until-close")


def test_the_gateway_side_framing_keeps_no_copy_of_the_body():
    frame = gateway.Framing()
    assert frame.feed(framed("chunked", b"x" * 100)) == "done"
    assert frame.payload is None and frame.fields == []
