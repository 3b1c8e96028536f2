"""What the two vendor adapters share around the official SDKs.

* One pooled HTTP client per process and endpoint (connection reuse across calls and runs).
* One TLS context per process, shared by every client (loading the CA bundle is 20 ms of CPU).
* Each attempt runs on a model-call thread, kept between calls (a thread started per call was a quarter
  of a streamed call's CPU); the caller's thread relays streamed text to `on_event`,
  polls `should_stop` (both touch the database, so they stay on the caller's thread) and, on cancel,
  shuts down the socket the worker is using. Closing a socket another thread is blocked on does not
  wake it on Linux; `shutdown()` does, and it sends the FIN the vendor needs to stop generating.
* A run of a worker's run pool whose heartbeat is beating runs the attempt on its own thread instead
  (inline): the heartbeat, not a poll, tells it to stop (interrupt shuts down the socket that thread
  is using, and marks the thread so its next socket operation fails), and text goes to `on_event`
  from the same thread. The hand-off to a helper and the caller's polling were ~6 % of a pooled
  worker's CPU (bench/fleet_profile.py).
* The retry loop is ours (the SDKs run with `max_retries=0`): the SDK's own loop sleeps where a
  cancel cannot reach it and says nothing about it, while the console must show "retrying in 8 s:
  HTTP 529 overloaded". It honours `retry-after-ms` / `Retry-After` (parsed like the SDKs do),
  `x-should-retry`, and backs off exponentially with jitter otherwise.
"""
from __future__ import annotations

import contextlib
import email.utils
import itertools
import json
import math
import os
import queue
import random
import socket
import ssl
import threading
import time
import urllib.request
from dataclasses import dataclass
from typing import Callable, Iterator

import httpcore2
import httpx2

from veronica.agent.providers import gateway, gateway_client
from veronica.agent.providers.base import CancelCheck, Cancelled, EventSink, ProviderError, Reply, Usage

POLL_SECONDS = 0.05
# A run of a worker's run pool (veronica.engine.fleet) learns of a stop from the process's heartbeat,
# which pushes it into the waiting call's inbox (interrupt): its wait wakes only this often, to show
# the heartbeat it is alive. 40 wake-ups a second per waiting call were a tenth of a pooled worker's CPU.
INTERRUPTIBLE_POLL_SECONDS = 0.5
MAX_INLINE_WAIT = 60.0  # a longer Retry-After is handed to the engine's re-wake backoff instead
RETRYABLE_STATUSES = {408, 409, 429}


class Malformed(Exception):
    """The vendor answered 200 with something that is not a usable reply (retried like a 5xx)."""


@dataclass(frozen=True)
class CallConfig:
    timeout: float = 120.0
    max_retries: int = 4
    backoff: float = 1.0
    stream: bool = True
    max_tokens: int = 4096

    @classmethod
    def from_settings(cls) -> "CallConfig":
        from django.conf import settings

        return cls(timeout=settings.MODEL_TIMEOUT, max_retries=settings.MODEL_MAX_RETRIES, backoff=settings.MODEL_BACKOFF,
                   stream=settings.MODEL_STREAM, max_tokens=settings.MODEL_MAX_TOKENS)


# --- sockets a worker thread is using, so another thread can abort them -----------------------------

_IN_USE: dict[int, object] = {}
_IN_USE_LOCK = threading.Lock()
_STOPPED: set[int] = set()  # threads whose inline model call was interrupted (under _IN_USE_LOCK)
_local = threading.local()  # per thread: its client shard, its stop mode, a read cap while draining


def mark_in_use(stream) -> None:
    """This thread's model call is on `stream` now (anything with get_extra_info("socket")): an interrupt
    shuts that socket down. A call already interrupted fails here, at its next socket operation."""
    me = threading.get_ident()
    with _IN_USE_LOCK:
        _IN_USE[me] = stream
        if me not in _STOPPED:
            return
    _shutdown(stream)
    raise ConnectionAbortedError("model call aborted; the connection was closed")


def read_capped(timeout: float | None) -> float | None:
    """A read's timeout, capped while the thread drains a finished answer (drain)."""
    cap = getattr(_local, "read_cap", None)
    return cap if cap is not None and (timeout is None or timeout > cap) else timeout


class _TrackedStream(httpcore2.NetworkStream):
    """Records, per thread, the socket it last read or wrote (the request that thread is making).
    An inline call interrupted between two socket operations fails at its next one (see interrupt)."""

    def __init__(self, inner: httpcore2.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        mark_in_use(self._inner)
        return self._inner.read(max_bytes, read_capped(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        mark_in_use(self._inner)
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None):
        return _TrackedStream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str):
        return self._inner.get_extra_info(info)


class _TrackingBackend(httpcore2.NetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore2.SyncBackend()

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        return _TrackedStream(self._inner.connect_tcp(host, port, timeout, local_address, socket_options))

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        return _TrackedStream(self._inner.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def drain(body: Iterator, seconds: float) -> None:
    """Read what is left of a streamed body (its last event was read), each read capped at `seconds`:
    a body read to its end hands its connection back to the pool. A read that fails or times out only
    costs the connection (the response is closed unread, as an SDK's stream closes it)."""
    _local.read_cap = seconds
    try:
        for _ in body:
            pass
    except Exception:  # noqa: BLE001 - the reply is complete: a late transport error is no failure of the call
        pass
    finally:
        _local.read_cap = None


def body_chunks(response, vendor_sdk) -> Iterator[bytes]:
    """A streamed response's bytes, its transport errors raised as the SDK's own stream raises them
    (APITimeoutError / APIConnectionError), so `classify` reads them the same."""
    try:
        yield from response.iter_bytes()
    except httpx2.TimeoutException as exc:
        raise vendor_sdk.APITimeoutError(request=response.request) from exc
    except (httpx2.RequestError, ssl.SSLError) as exc:
        raise vendor_sdk.APIConnectionError(request=response.request) from exc


def abort_thread_socket(thread_id: int | None, unless: Callable[[], bool] = lambda: False) -> bool:
    """Shut down the socket `thread_id` is using: its blocked read returns and the peer sees FIN.
    `unless` is checked under the sockets' lock (the thread's call may have ended meanwhile)."""
    with _IN_USE_LOCK:
        stream = _IN_USE.pop(thread_id, None) if thread_id is not None and not unless() else None
    return _shutdown(stream)


def _shutdown(stream) -> bool:
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is None:
        return False
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    return True


def track_sockets(http: httpx2.Client) -> None:
    """httpx2 takes no network backend argument: swap ours into its pools (the direct one and any
    proxy from HTTPS_PROXY / ALL_PROXY, which a custom transport= would silently drop)."""
    transports = [getattr(http, "_transport", None), *getattr(http, "_mounts", {}).values()]
    transports += [part for t in transports for part in getattr(t, "parts", ())]  # the model gateway's direct way
    for transport in transports:
        pool = getattr(transport, "_pool", None)
        if pool is not None and hasattr(pool, "_network_backend"):
            pool._network_backend = _TrackingBackend()


_CLIENTS: dict[tuple, object] = {}
_CLIENTS_LOCK = threading.Lock()


def _runs() -> int:
    from django.conf import settings

    return getattr(settings, "RUNS_PER_WORKER", 1)


def connection_limits() -> httpx2.Limits:
    """A streamed call holds its own connection for its whole length, so a process makes as many
    calls at once as it has runs (veronica.engine.fleet: VERONICA_RUNS_PER_WORKER). httpx's default
    (100 connections, 20 kept alive) queued the 101st call of a worker inside the pool, where its
    latency is hidden and a cancel cannot reach it, and reconnected all but 20 after every call.
    Per shard (see shard()): each keeps its share of the runs' connections alive."""
    return httpx2.Limits(max_connections=None, max_keepalive_connections=max(20, -(-_runs() // shards())))


# The HTTP pool walks every connection it holds twice per request (httpcore's assignment of requests to
# connections): with a whole run pool's calls in one client, a call cost O(runs) of CPU there, about a
# twentieth of a pooled worker's CPU at 200 calls at once. Each run thread takes one of a few clients
# (round robin, kept for the thread's life), so a walk covers RUNS_PER_SHARD connections or so.
RUNS_PER_SHARD = 32
MAX_SHARDS = 8
_next_shard = itertools.count()


def shards() -> int:
    return max(1, min(MAX_SHARDS, _runs() // RUNS_PER_SHARD))


def shard() -> int:
    """This thread's client shard: fixed for the thread, so its calls reuse the keep-alive connections
    of one pool; spread over the threads, so each pool holds a few of the process's calls."""
    n = shards()
    if n == 1:
        return 0
    mine = getattr(_local, "shard", None)
    if mine is None:
        mine = _local.shard = next(_next_shard)
    return mine % n


_SSL_CONTEXTS: dict[int, ssl.SSLContext] = {}


def ssl_context() -> ssl.SSLContext:
    """The process's TLS settings for its vendor clients, built once: the one httpx builds by default
    (system CA bundle, SSL_CERT_FILE / SSL_CERT_DIR honoured), whose CA bundle costs 20 ms of CPU to
    load. Every shard's client built its own under _CLIENTS_LOCK, so a pool's first burst of calls
    queued behind 20 ms per shard and endpoint. An SSLContext is safe to share between threads."""
    pid = os.getpid()
    context = _SSL_CONTEXTS.get(pid)
    if context is None:
        context = _SSL_CONTEXTS[pid] = httpx2.create_ssl_context()
    return context


def shared(key: tuple, make: Callable[[httpx2.Client], object], timeout: float):
    """One SDK client per process, endpoint and shard, over an HTTP client whose sockets can be aborted."""
    full_key = (os.getpid(), timeout, shard(), *key)  # a forked worker never shares its parent's sockets
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(full_key)
        if client is None:
            http = httpx2.Client(timeout=httpx2.Timeout(timeout, connect=min(timeout, 10.0)), follow_redirects=True,
                                 limits=connection_limits(), verify=ssl_context(), transport=via_gateway())
            track_sockets(http)
            client = _CLIENTS[full_key] = make(http)
        return client


def via_gateway():
    """The host's model gateway (veronica.agent.providers.gateway), when its sentinel started one and no
    proxy is set (a proxy from the environment keeps the direct way, as before): None otherwise."""
    path = os.environ.get(gateway.SOCKET_ENV)
    if not path or urllib.request.getproxies():
        return None
    direct = httpx2.HTTPTransport(limits=connection_limits(), verify=ssl_context())
    return gateway_client.GatewayTransport(path, connection_limits().max_keepalive_connections, direct,
                                           scope=lambda: getattr(_local, "scope", None) or "", mark=mark_in_use,
                                           cap=read_capped)


@contextlib.contextmanager
def call_scope(scope: str):
    """The model calls this thread makes inside are `scope`'s (a member): through the model gateway, a
    call whose worker died is kept for the next identical request of the same scope (a resumed run)."""
    before = getattr(_local, "scope", None)
    _local.scope = scope
    try:
        yield
    finally:
        _local.scope = before


def scoped(attempt: "Attempt") -> "Attempt":
    """The attempt, carrying the calling thread's scope to the model-call thread that runs it."""
    scope = getattr(_local, "scope", None)
    if scope is None:
        return attempt

    def run(emit, aborted):
        before, _local.scope = getattr(_local, "scope", None), scope
        try:
            return attempt(emit, aborted)
        finally:
            _local.scope = before

    return run


# --- one attempt on a worker thread -----------------------------------------------------------------

Attempt = Callable[[Callable[[str], None], threading.Event], object]


_INLINE = object()  # in _WAITING: the thread runs its model call's attempt itself
_WAITING: dict[int, object] = {}  # caller thread -> the inbox its model call waits on, or _INLINE


def interruptible(on: bool, pushed: Callable[[], bool] | None = None) -> None:
    """This thread's stops are pushed to it (interrupt), so its model calls poll should_stop rarely.
    pushed: whether the pushes arrive now (its run pool's heartbeat beats); while it says so, each
    attempt runs on this thread (inline), with no helper and no poll at all."""
    _local.interruptible = on
    _local.pushed = pushed if on else None


def interrupt(thread_id: int | None) -> None:
    """End the model call `thread_id` waits on or makes (its should_stop now says stop): at once."""
    inbox = _WAITING.get(thread_id) if thread_id is not None else None
    if inbox is _INLINE:
        with _IN_USE_LOCK:
            if _WAITING.get(thread_id) is not _INLINE:
                return  # its attempt ended meanwhile: the socket it last used is no longer this call's
            _STOPPED.add(thread_id)  # a socket operation still to come fails (see _TrackedStream._mark)
            stream = _IN_USE.pop(thread_id, None)
        _shutdown(stream)  # one it is blocked on returns now
    elif inbox is not None:
        inbox.put(("stop", None))


def calling(thread_id: int | None) -> bool:
    """`thread_id` is inside an inline model call (alive, though it polls nothing while it waits)."""
    return thread_id is not None and _WAITING.get(thread_id) is _INLINE


# Model-call threads are kept between calls. A thread started per call (and its inbox a queue.Queue,
# a Condition per wait) was a quarter of a streamed call's CPU in the worker (bench/model_call_cpu.py).
# A helper takes one attempt at a time and goes back to the idle list only once that attempt has
# returned, so a call that was aborted (its caller raised Cancelled while the attempt still unwinds)
# never shares its helper, nor its inbox, with the next call. Idle helpers beyond MAX_IDLE_HELPERS,
# or idle for HELPER_IDLE_SECONDS, end.
MAX_IDLE_HELPERS = 256
HELPER_IDLE_SECONDS = 60.0


class _Helper:
    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.inbox: queue.SimpleQueue | None = None  # the call it serves now (changed under _IN_USE_LOCK)
        self.thread = threading.Thread(target=self._serve, name="model-call", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                job = self.jobs.get(timeout=HELPER_IDLE_SECONDS)
            except queue.Empty:
                if _retire(self):
                    return
                continue  # taken for a call just now: its job is on the way
            self._run(*job)
            if not _park(self):
                return

    def _run(self, attempt: "Attempt", inbox: queue.SimpleQueue, aborted: threading.Event) -> None:
        with _IN_USE_LOCK:
            self.inbox = inbox
        try:
            inbox.put(("done", attempt(lambda delta: inbox.put(("text", delta)), aborted)))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            inbox.put(("error", exc))
        finally:
            with _IN_USE_LOCK:
                _IN_USE.pop(threading.get_ident(), None)
                self.inbox = None

    def abort(self, inbox: queue.SimpleQueue) -> None:
        """Shut down the socket of the call `inbox` belongs to, if this helper still serves it: one
        that finished meanwhile may already serve another run's call, whose socket is not ours to cut."""
        abort_thread_socket(self.thread.ident, unless=lambda: self.inbox is not inbox)


_IDLE: list[_Helper] = []
_IDLE_LOCK = threading.Lock()


def _take_helper() -> _Helper:
    with _IDLE_LOCK:
        if _IDLE:
            return _IDLE.pop()
    return _Helper()


def _park(helper: _Helper) -> bool:
    """The helper's attempt is over: idle it for the next call (False: enough are idle, it ends)."""
    with _IDLE_LOCK:
        if len(_IDLE) >= MAX_IDLE_HELPERS:
            return False
        _IDLE.append(helper)
        return True


def _retire(helper: _Helper) -> bool:
    """An idle helper's wait ran out: it ends unless a call took it meanwhile."""
    with _IDLE_LOCK:
        if helper in _IDLE:
            _IDLE.remove(helper)
            return True
        return False


def _forget_helpers() -> None:
    """In a forked child: none of its parent's threads exist, so no helper, and no holder of a lock
    one of them held at the fork (it would stay taken for ever): the locks are made anew. Nor the
    sockets their calls were using: a child thread given such a thread's ident would abort the parent's
    (the same socket, inherited) when a cancel came before its own first read."""
    global _IDLE_LOCK, _IN_USE_LOCK
    _IDLE_LOCK, _IN_USE_LOCK = threading.Lock(), threading.Lock()
    _IDLE.clear()
    _IN_USE.clear()
    _STOPPED.clear()
    _WAITING.clear()


os.register_at_fork(after_in_child=_forget_helpers)


def run_attempt(attempt: Attempt, *, should_stop: CancelCheck, on_event: EventSink | None, streamed: list[int]):
    """Run `attempt(emit, aborted)` on a model-call thread; relay its text, abort it on cancel. Inline
    (on this thread) while this thread's stops are pushed to it (interruptible)."""
    pushed = getattr(_local, "pushed", None)
    if pushed is not None and pushed():
        return run_inline(attempt, should_stop=should_stop, on_event=on_event, streamed=streamed)
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    me = threading.get_ident()
    poll = INTERRUPTIBLE_POLL_SECONDS if getattr(_local, "interruptible", False) else POLL_SECONDS
    aborted = threading.Event()
    _WAITING[me] = inbox
    try:
        helper = _take_helper()
        helper.jobs.put((attempt, inbox, aborted))
        while True:
            try:
                kind, value = inbox.get(timeout=poll)
            except queue.Empty:
                kind, value = "", None
            if kind == "done":
                return value
            if kind == "error":
                raise value
            if kind == "text" and value:
                streamed[0] += len(value)
                if on_event is not None:
                    on_event({"type": "text", "delta": value})
            if should_stop():
                aborted.set()
                helper.abort(inbox)
                raise Cancelled("model call aborted; the connection was closed")
    finally:
        _WAITING.pop(me, None)


def run_inline(attempt: Attempt, *, should_stop: CancelCheck, on_event: EventSink | None, streamed: list[int]):
    """Run `attempt(emit, aborted)` on this thread. Nothing polls while it waits: a stop must come as an
    interrupt (the run pool's heartbeat), which shuts down the socket this thread is using, or fails its
    next socket operation; should_stop is asked after each streamed text (a heartbeat that stalls mid-call
    leaves should_stop renewing and checking on its own, slot.RunLease.should_stop) and when the attempt
    fails. Connecting (and a TLS handshake) is the one wait an interrupt does not cut (a new connection's
    first write fails instead): connections are kept alive, and a connect is bounded by its timeout."""
    me = threading.get_ident()
    aborted = threading.Event()

    def emit(delta: str) -> None:
        if delta:
            streamed[0] += len(delta)
            if on_event is not None:
                on_event({"type": "text", "delta": delta})
        if should_stop():  # a stop the sink's own fence found (a lost lease), or one the heartbeat heard
            aborted.set()
            abort_thread_socket(me)
            raise Cancelled("model call aborted; the connection was closed")

    _WAITING[me] = _INLINE
    try:
        return attempt(emit, aborted)
    except Cancelled:
        raise
    except BaseException:
        with _IN_USE_LOCK:
            stopped = me in _STOPPED
        if stopped or should_stop():
            raise Cancelled("model call aborted; the connection was closed") from None
        raise
    finally:
        with _IN_USE_LOCK:  # no interrupt after this cuts the socket of a request that is not this call's
            _WAITING.pop(me, None)
            _IN_USE.pop(me, None)
            _STOPPED.discard(me)


# --- errors -------------------------------------------------------------------------------------------

def retry_after(headers) -> float | None:
    """Seconds the vendor asked us to wait: retry-after-ms, then Retry-After (seconds or an HTTP date)."""
    if headers is None:
        return None
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            value = float(raw) / divisor
        except ValueError:
            continue
        if math.isfinite(value) and value >= 0:
            return value
    raw = headers.get("retry-after")
    parsed = email.utils.parsedate_tz(raw) if raw else None
    return max(email.utils.mktime_tz(parsed) - time.time(), 0.0) if parsed else None


def _label(exc) -> str:
    kind = getattr(exc, "type", None) or getattr(exc, "code", None)
    body = getattr(exc, "body", None)
    if not kind and isinstance(body, dict):
        error = body.get("error") if isinstance(body.get("error"), dict) else body
        kind = error.get("type") or error.get("code")
    if isinstance(kind, str) and kind:
        return kind.removesuffix("_error").replace("_", " ")
    return ""


def _api_message(exc) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error") if isinstance(body.get("error"), dict) else body
        if isinstance(error.get("message"), str):
            return error["message"][:300]
    return str(getattr(exc, "message", "") or exc)[:300]


def classify(exc: BaseException, vendor: str) -> ProviderError:
    """Map an SDK exception onto the seam: permanent (auth, not found, bad request, context overflow)
    or transient (rate limit, 5xx, 529, connection, timeout, malformed body), with the request id."""
    status = getattr(exc, "status_code", None)
    request_id = getattr(exc, "request_id", None) or ""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if isinstance(exc, (Malformed, json.JSONDecodeError)) or type(exc).__name__ in ("ValidationError", "APIResponseValidationError"):
        return ProviderError(f"{vendor}: malformed response ({exc})", status=status, request_id=request_id)
    if status in (None, 200) and isinstance(getattr(exc, "body", None), dict):  # an error event inside a 200 stream
        label = _label(exc) or "error"
        return ProviderError(f"{vendor}: stream error {label}: {_api_message(exc)}", status=None, request_id=request_id,
                             permanent=_label_type(exc) in ("invalid_request_error", "authentication_error", "permission_error"))
    if status is None:  # APIConnectionError / APITimeoutError and the transport errors under them
        timed_out = "timeout" in type(exc).__name__.lower() or "timed out" in str(exc).lower()
        return ProviderError(f"{vendor}: {'timeout' if timed_out else 'connection error'} ({exc})", status=None)
    label = "overloaded" if status == 529 else _label(exc)  # 529 is Anthropic's; proxies pass it through
    reason = f"HTTP {status}" + (f" {label}" if label else "")
    should = headers.get("x-should-retry") if headers is not None else None
    transient = status in RETRYABLE_STATUSES or status >= 500
    if should in ("true", "false"):
        transient = should == "true"
    message = f"{vendor}: {reason}: {_api_message(exc)}" + (f" (request id {request_id})" if request_id else "")
    return ProviderError(message, permanent=not transient, status=status, request_id=request_id,
                         retry_after=retry_after(headers))


def _label_type(exc) -> str:
    kind = getattr(exc, "type", None)
    if not kind and isinstance(getattr(exc, "body", None), dict):
        error = exc.body.get("error")
        kind = error.get("type") if isinstance(error, dict) else None
    return kind or ""


def reason_of(error: ProviderError) -> str:
    """Short text for the console: 'HTTP 529 overloaded', 'timeout', 'malformed response'."""
    text = str(error).split(": ", 1)[-1]
    if text.startswith(("HTTP ", "stream error")):
        return text.split(": ", 1)[0]
    return text.split(" (", 1)[0]


# --- the call: attempts and visible retries --------------------------------------------------------------

def backoff_delay(attempt: int, base: float) -> float:
    """Exponential from `base` seconds, capped at 30 s, minus up to 25 % jitter (as the SDKs do)."""
    return min(base * (2 ** attempt), 30.0) * (1 - 0.25 * random.random())


def sleep_unless_stopped(seconds: float, should_stop: CancelCheck) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if should_stop():
            raise Cancelled("cancelled while backing off")
        time.sleep(min(POLL_SECONDS, max(deadline - time.monotonic(), 0)))


def call(attempt: Attempt, *, vendor: str, cfg: CallConfig, should_stop: CancelCheck, on_event: EventSink | None,
         input_estimate: int):
    """Run the attempt with retries; the last error (or a permanent one) is raised as ProviderError."""
    last: ProviderError | None = None
    spent = Usage()  # attempts that failed after streaming part of an answer: generated, so billed
    attempt = scoped(attempt)
    for n in range(cfg.max_retries + 1):
        if should_stop():
            raise Cancelled("cancelled before the model call")
        streamed = [0]
        try:
            result = run_attempt(attempt, should_stop=should_stop, on_event=on_event, streamed=streamed)
            if spent.output and isinstance(result, Reply):
                result.usage = added(result.usage, spent)
            return result
        except Cancelled as exc:  # what was generated before the hang-up is billed: say so
            now = Usage(input=input_estimate, output=max(streamed[0] // 4, 1), estimated=True) if streamed[0] else None
            exc.usage = added(now, spent) if now is not None or spent.output else None
            raise
        except ProviderError:
            raise
        except Exception as exc:  # noqa: BLE001 - every SDK failure is classified below
            if not _is_vendor_failure(exc):
                raise
            last = classify(exc, vendor)
            if streamed[0]:  # the vendor generated (and billed) part of an answer before failing
                spent = added(spent, Usage(input=input_estimate, output=max(streamed[0] // 4, 1), estimated=True))
            if spent.output:
                last.usage = spent
            if last.permanent or n == cfg.max_retries:
                break
            delay = last.retry_after if last.retry_after is not None else backoff_delay(n, cfg.backoff)
            if delay > MAX_INLINE_WAIT:
                break
            if on_event is not None:
                on_event({"type": "retry", "delay": round(delay, 2), "reason": reason_of(last), "attempt": n + 1,
                          "of": cfg.max_retries})
            sleep_unless_stopped(delay, should_stop)
    assert last is not None
    if not last.permanent:
        last.args = (f"{last.args[0]} [gave up after {n + 1} attempt(s)]",)
    raise last


def added(a: Usage | None, b: Usage) -> Usage:
    a = a or Usage()
    return Usage(input=a.input + b.input, output=a.output + b.output, cache_read=a.cache_read + b.cache_read,
                 cache_write=a.cache_write + b.cache_write, estimated=a.estimated or b.estimated)


def _is_vendor_failure(exc: BaseException) -> bool:
    """SDK errors, transport errors and unparseable bodies; anything else is a bug and propagates."""
    module = type(exc).__module__.split(".")[0]
    return module in ("openai", "anthropic", "httpx2", "httpcore2", "pydantic", "pydantic_core") or \
        isinstance(exc, (Malformed, json.JSONDecodeError, OSError))


def json_body(body: dict) -> bytes:
    """A request body encoded as the SDKs encode one (openai's openapi_dumps: compact, UTF-8, no NaN)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def estimate_of(payload: bytes) -> int:
    """chars / 4 of an encoded request (bytes: a non-ASCII character counts its UTF-8 length)."""
    return max(len(payload) // 4, 1)


def estimate_tokens(*parts) -> int:
    """chars / 4 of everything sent: the estimate for a reply without usage."""
    return max(sum(len(p if isinstance(p, str) else json.dumps(p, default=str)) for p in parts) // 4, 1)
