"""The host's model gateway (issue 25, a worker SIGKILLed mid-way): a real gateway process between the
official SDKs and the mock vendor servers. A call outlives the worker process that made it and is taken
over by the same member's identical request; a cancel still reaches the vendor; nothing is shared across
members; bad requests get a 400 naming what is wrong; without a gateway the calls go direct."""
from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import socket
import stat
import threading
import time

import pytest

from tests.vendors import faults as f
from tests.vendors.mock_openai import MockOpenAI
from veronica.agent.providers import gateway, sdk
from veronica.agent.providers.base import Cancelled
from veronica.agent.providers.openai_compat import OpenAIProvider
from veronica.agent.providers.sdk import CallConfig
from veronica.plumbing import procstat

MESSAGES = [{"role": "user", "content": "list the files"}]
CFG = CallConfig(timeout=20.0, max_retries=0, backoff=0.01, stream=True, max_tokens=256)
NEVER = lambda: False  # noqa: E731


@pytest.fixture
def through_gateway(monkeypatch):
    """A gateway started as a host's sentinel starts it; the SDK clients made from here go through it."""
    monkeypatch.delenv(gateway.SOCKET_ENV, raising=False)
    process = gateway.spawn()
    assert process is not None, "the gateway did not start"
    monkeypatch.setattr(sdk, "_CLIENTS", {})
    yield process
    gateway.stop(process)


@pytest.fixture
def mock():
    vendor = MockOpenAI(api_key="sk-gw").start()
    yield vendor
    vendor.stop()


def provider(mock) -> OpenAIProvider:
    return OpenAIProvider("model-x", mock.base_url, "sk-gw", CFG)


def call_as(scope: str, mock, should_stop=NEVER):
    with sdk.call_scope(scope):
        return provider(mock).complete("SYS", MESSAGES, [], should_stop=should_stop)


def a_worker_calling(scope: str, mock) -> None:
    """A worker process with a run pool: other threads beside the one calling (the gateway must tell its
    death from a cancel when the last of them has let go of the socket)."""
    for _ in range(16):
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    call_as(scope, mock)


def call_in_a_worker_killed_mid_answer(scope: str, mock, kill_after: float) -> None:
    """A forked process (a q2 worker) makes the call; it is SIGKILLed while the answer streams."""
    child = multiprocessing.get_context("fork").Process(target=a_worker_calling, args=(scope, mock))
    kill_once_the_vendor_has_the_call(child, mock, kill_after)


def kill_once_the_vendor_has_the_call(child, mock, kill_after: float) -> None:
    """Start the child; SIGKILL it `kill_after` s after its request has reached the vendor (not by the
    clock alone: on a busy host the request may be late, and the vendor's script answers in order)."""
    before = len(mock.model_requests())
    child.start()
    deadline = time.monotonic() + 30
    while len(mock.model_requests()) == before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(mock.model_requests()) == before + 1, "the worker's request never reached the vendor"
    time.sleep(kill_after)
    os.kill(child.pid, signal.SIGKILL)
    child.join()


def test_a_call_outlives_its_dead_worker_and_the_same_members_resumed_request_takes_it_over(through_gateway, mock):
    mock.push(f.text("the slow answer", chunks=5, delay=0.3))
    call_in_a_worker_killed_mid_answer("member:7", mock, kill_after=0.5)
    reply = call_as("member:7", mock)
    assert reply.text == "the slow answer" and not reply.usage.estimated, (reply.text, len(mock.model_requests()))
    assert len(mock.model_requests()) == 1, "the resumed run's call went to the vendor again"
    assert mock.model_requests()[0].disconnected_at is None, "the vendor saw the dead worker's hang-up"


def test_an_answer_finished_after_its_worker_died_is_kept_for_the_resume(through_gateway, mock):
    mock.push(f.text("answered while nobody listened", chunks=2, delay=0.2))
    call_in_a_worker_killed_mid_answer("member:8", mock, kill_after=0.25)
    time.sleep(0.8)  # the answer has ended at the gateway
    assert call_as("member:8", mock).text == "answered while nobody listened"
    assert len(mock.model_requests()) == 1


def test_an_answer_its_worker_read_but_died_before_storing_is_given_to_the_resume_once(through_gateway, mock):
    mock.push(f.text("read, never stored"), f.text("asked again"), f.text("asked again, alive"))
    done = multiprocessing.get_context("fork").Event()

    def worker():
        call_as("member:13", mock)
        done.set()
        time.sleep(30)  # the answer is read in full; the worker dies before it stores it

    child = multiprocessing.get_context("fork").Process(target=worker)
    child.start()
    assert done.wait(20)
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    assert call_as("member:13", mock).text == "read, never stored"
    assert len(mock.model_requests()) == 1
    assert call_as("member:13", mock).text == "asked again"  # this worker lives: asking again is a new call
    assert call_as("member:13", mock).text == "asked again, alive"
    assert call_as("member:14", mock).text == "done"  # another member: its own call (the mock's default answer)
    assert len(mock.model_requests()) == 4


def test_a_dead_workers_call_is_never_given_to_another_member_nor_twice(through_gateway, mock):
    mock.push(f.text("member 9's answer", chunks=4, delay=0.2), f.text("member 10's own"), f.text("a new call"))
    call_in_a_worker_killed_mid_answer("member:9", mock, kill_after=0.3)
    assert call_as("member:10", mock).text == "member 10's own"  # the same body, another member
    assert call_as("member:9", mock).text == "member 9's answer"
    assert call_as("member:9", mock).text == "a new call"  # taken over once: the next identical request is a call
    assert len(mock.model_requests()) == 3


def test_a_call_without_a_member_is_never_kept(through_gateway, mock):
    mock.push(f.text("nobody's", chunks=3, delay=0.2), f.text("fresh"))
    child = multiprocessing.get_context("fork").Process(
        target=lambda: provider(mock).complete("SYS", MESSAGES, [], should_stop=NEVER))
    kill_once_the_vendor_has_the_call(child, mock, 0.2)
    assert provider(mock).complete("SYS", MESSAGES, [], should_stop=NEVER).text == "fresh"
    assert len(mock.model_requests()) == 2


def test_a_cancel_by_a_live_worker_still_hangs_up_on_the_vendor(through_gateway, mock):
    mock.push(f.generate(chunks=400, delay=0.05), f.text("after the cancel"))
    started = time.monotonic()
    with pytest.raises(Cancelled):
        call_as("member:11", mock, should_stop=lambda: time.monotonic() - started > 0.3)
    cancelled = mock.model_requests()[0]
    deadline = time.monotonic() + 5
    while cancelled.disconnected_at is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cancelled.disconnected_at is not None, "the vendor went on generating for a cancelled call"
    assert call_as("member:11", mock).text == "after the cancel"  # never the cancelled call's stream
    assert len(mock.model_requests()) == 2


def test_an_answer_that_is_not_a_success_is_never_kept_for_another_request():
    async def check():
        gw = gateway.Gateway()
        call = gateway.Call("key")
        call.kept = False  # a 429 / 5xx
        call.task = asyncio.ensure_future(asyncio.sleep(30))
        await gw.left(call, dead_mark())
        await asyncio.sleep(0.01)
        assert gw.orphans == {} and call.task.cancelled()

    asyncio.run(check())


def dead_mark() -> tuple[int, int]:
    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,))
    child.start()
    mark = gateway.peer_mark_of(child.pid)
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    assert mark is not None and gateway.gone(mark)
    return mark


def test_the_gateway_is_reachable_only_by_its_user(through_gateway):
    path = os.environ[gateway.SOCKET_ENV]
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


@pytest.mark.parametrize("request_bytes, names", [
    (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n", gateway.UPSTREAM),
    (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-veronica-upstream: ftp://x:21\r\n\r\n", gateway.UPSTREAM),
    (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n", "content-length"),
    (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 99999999999\r\n\r\n", "request body over"),
    (b"GARBAGE\r\n\r\n", "request line"),
    (b"POST / HTTP/1.1\r\nx: " + b"a" * (gateway.MAX_HEAD + 10) + b"\r\n\r\n", "request head over"),
])
def test_a_bad_request_gets_a_400_naming_what_is_wrong(through_gateway, request_bytes, names):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(os.environ[gateway.SOCKET_ENV])
        s.sendall(request_bytes)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 ") and names.encode() in answer


def test_without_a_gateway_the_calls_go_straight_to_the_vendor(monkeypatch, tmp_path, mock):
    monkeypatch.setenv(gateway.SOCKET_ENV, str(tmp_path / "no-such-socket"))
    monkeypatch.setattr(sdk, "_CLIENTS", {})
    mock.push(f.text("direct"))
    assert call_as("member:12", mock).text == "direct"


def test_the_gateway_ends_with_the_host_that_started_it(tmp_path):
    """Its sentinel SIGKILLed with the rest of the host: no gateway is left holding calls nobody takes."""
    ready = tmp_path / "pid"

    def host():
        process = gateway.spawn()
        ready.write_text(str(process.pid))
        time.sleep(60)

    parent = multiprocessing.get_context("fork").Process(target=host)
    parent.start()
    deadline = time.monotonic() + 20
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int(ready.read_text())
    os.kill(parent.pid, signal.SIGKILL)
    parent.join()
    deadline = time.monotonic() + 10
    while procstat.stat(pid) is not None and procstat.stat(pid).state not in ("Z", "X") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert procstat.stat(pid) is None or procstat.stat(pid).state in ("Z", "X")
