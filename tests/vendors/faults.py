"""The fault-injection scheme shared by the mock vendor servers (OpenAI and Anthropic wire formats).

Each model request pops the next scripted behaviour; an empty script answers `text("done")`.
A behaviour is a plain dict (so a test in another process can post it as JSON to `/_mock/script`):

    text(content, chunks=1, delay=0)   a normal answer; streamed in `chunks` pieces `delay` s apart
    tool_call(name, args, text="")     one tool call (optionally with text before it)
    generate(chunks=400, delay=0.05)   a long stream that keeps producing until the client disconnects
    rate_limit(retry_after=1, ms=None) 429 with Retry-After (seconds) or retry-after-ms
    status(code, message)              any HTTP error (500, 503, ...)
    overloaded()                       529 overloaded (Anthropic's overload status)
    hang(seconds=30)                   read the request, send nothing (until the client disconnects)
    malformed(stream_after=0)          a 200 whose body is not the vendor's JSON (or a broken SSE event
                                       after `stream_after` good chunks)
    stream_error(after=1)              a stream that ends in the vendor's in-stream error event (overloaded)
    empty()                            a 200 with no text and no tool calls
    max_tokens(text)                   an answer cut at the token limit
    unauthorized()                     401
    context_overflow()                 400 "prompt is too long" / context_length_exceeded
    no_usage(text)                     an answer without a usage block
    frames(pieces, delay, hold)        a 200 event stream written piece by piece exactly as given

Load (configure(); POST /_mock/config from another process): `latency` seconds before every model
answer, and `capacity`: a request arriving while that many are already in flight gets 429 with
`Retry-After: retry_after` (a vendor's concurrency limit). The concurrency observer counts requests
in flight and the most seen at once (stats(); GET /_mock/stats).

Every request is recorded (path, headers, body, client port, behaviour, timings; for streams the
chunks sent and when the client disconnected) for assertions.

For load (bench/fleet.py), a vendor can also be configured (`configure()`, POST /_mock/config, or the
command line): `latency` seconds before every model answer (a real call takes seconds), `steps` for a
scripted conversation when the script is empty (each request answers a `step_tool` call until the
conversation holds steps - 1 tool results, then "done"; so every run makes `steps` calls whatever its
member), and `lean` (keep no request records or prompt-cache state: a long bench stays flat).
"""
from __future__ import annotations

import collections
import json
import select
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def text(content: str = "done", chunks: int = 1, delay: float = 0.0) -> dict:
    return {"kind": "text", "text": content, "chunks": chunks, "delay": delay}


def tool_call(name: str, args: dict, text: str = "") -> dict:
    return {"kind": "tool_call", "name": name, "args": args, "text": text}


def generate(chunks: int = 400, delay: float = 0.05) -> dict:
    return {"kind": "generate", "chunks": chunks, "delay": delay}


def rate_limit(retry_after: float | None = 1, ms: int | None = None) -> dict:
    return {"kind": "status", "status": 429, "message": "rate limited", "retry_after": retry_after, "retry_after_ms": ms}


def status(code: int, message: str = "server error", retry_after: float | None = None) -> dict:
    return {"kind": "status", "status": code, "message": message, "retry_after": retry_after, "retry_after_ms": None}


def overloaded() -> dict:
    return status(529, "Overloaded")


def hang(seconds: float = 30) -> dict:
    return {"kind": "hang", "seconds": seconds}


def malformed(stream_after: int = 0) -> dict:
    return {"kind": "malformed", "stream_after": stream_after}


def stream_error(after: int = 1) -> dict:
    """A 200 stream that breaks off with the vendor's in-stream error event (overloaded) after `after` chunks."""
    return {"kind": "stream_error", "after": after}


def raw_calls(calls: list[dict], text: str = "", finish: str | None = None, usage: bool = True) -> dict:
    """Tool calls exactly as given: each {"id": str|None, "name": str, "arguments": str (OpenAI, raw JSON text)
    or "input": any (Anthropic)}; `finish` overrides finish_reason / stop_reason."""
    return {"kind": "raw_calls", "calls": calls, "text": text, "finish": finish, "usage": usage}


def cut(content: str = "The answer is cut off mid-sen", calls: list | None = None) -> dict:
    """A 200 stream that ends cleanly (final chunk) after some text / tool-call deltas but with no
    finish_reason / message_delta, no usage and no [DONE] / message_stop: a proxy or server that dropped off."""
    return {"kind": "cut", "text": content, "calls": calls or []}


def raw(body: bytes | str, status: int = 200, content_type: str = "text/html", headers: dict | None = None) -> dict:
    """Any HTTP answer, byte for byte (an HTML error page from a proxy, an empty body, ...)."""
    return {"kind": "raw", "body": body if isinstance(body, str) else body.decode("latin-1"), "status": status,
            "content_type": content_type, "headers": headers or {}}


def pings(seconds: float = 30, interval: float = 0.3, headers_only: bool = False) -> dict:
    """A 200 event stream that sends only keep-alive comments/pings (or, headers_only, nothing at all)."""
    return {"kind": "pings", "seconds": seconds, "interval": interval, "headers_only": headers_only}


def frames(pieces: list[str], delay: float = 0.01, hold: float = 0.0) -> dict:
    """A 200 event stream written exactly as `pieces` (raw SSE text, split anywhere: mid-line, between
    CR and LF), each its own write `delay` s apart; then the body stays open `hold` s before it ends."""
    return {"kind": "frames", "pieces": pieces, "delay": delay, "hold": hold}


def empty() -> dict:
    return {"kind": "empty"}


def max_tokens(content: str = "The answer is cut off mid-sen") -> dict:
    return {"kind": "max_tokens", "text": content}


def unauthorized() -> dict:
    return status(401, "invalid x-api-key")


def context_overflow() -> dict:
    return {"kind": "status", "status": 400, "message": "context", "overflow": True, "retry_after": None, "retry_after_ms": None}


def no_usage(content: str = "an answer without usage") -> dict:
    return {"kind": "text", "text": content, "chunks": 1, "delay": 0.0, "usage": False}


def tokens(data) -> int:
    """The mock's tokenizer: four characters of canonical JSON per token."""
    raw = data if isinstance(data, str) else json.dumps(data, sort_keys=True, separators=(",", ":"))
    return max(len(raw) // 4, 1)


@dataclass
class Record:
    method: str
    path: str
    headers: dict
    body: dict | None
    port: int
    behaviour: dict | None = None
    started: float = field(default_factory=time.monotonic)
    chunks_sent: int = 0
    disconnected_at: float | None = None
    finished_at: float | None = None
    usage: dict | None = None


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # hundreds of runs connect at once in the fleet bench (the default backlog is 5)

    def handle_error(self, request, client_address) -> None:
        """A client that hung up (cancel, timeout) is part of the script, not a server error."""
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionError, OSError)):
            super().handle_error(request, client_address)


class ClientGone(Exception):
    """The client closed the connection (cancel); the server stops generating."""


class MockVendor:
    """A real HTTP server on a free port, in a thread. Subclasses speak one vendor's wire format."""

    dialect = "base"

    def __init__(self, api_key: str = "test-key", host: str = "127.0.0.1", port: int = 0) -> None:
        self.api_key = api_key
        self.script: list[dict] = []
        self.requests: list[Record] = []
        self.lock = threading.Lock()
        self.steps = 0
        self.step_tool, self.step_args = "list_dir", {"path": "."}
        self.lean = False
        self.served = 0  # model answers given (kept in lean mode too)
        self.httpd = _Server((host, port), self._handler())
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread: threading.Thread | None = None
        self.latency, self.capacity, self.capacity_retry_after = 0.0, None, 1.0
        self.in_flight = self.max_in_flight = self.over_capacity = 0
        self.late_calls, self.late_sum, self.late_max = 0, 0.0, 0.0  # how far past `latency` answers started
        # (wall-clock time, tool results in the conversation) of each model request as it arrived, lean mode
        # too: a bench tells from it when each run's first call left (bench/fleet.py)
        self.arrivals: collections.deque = collections.deque(maxlen=200_000)

    def late(self, seconds: float) -> None:
        with self.lock:
            self.late_calls += 1
            self.late_sum += seconds
            self.late_max = max(self.late_max, seconds)

    # --- control -------------------------------------------------------------------------------
    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def push(self, *behaviours: dict) -> "MockVendor":
        with self.lock:
            self.script.extend(behaviours)
        return self

    def configure(self, latency: float | None = None, capacity: int | None = None, retry_after: float | None = None,
                  steps: int | None = None, tool: str | None = None, args: dict | None = None,
                  lean: bool | None = None) -> "MockVendor":
        with self.lock:
            self.latency = self.latency if latency is None else float(latency)
            self.capacity = capacity if capacity is None or capacity > 0 else None
            self.capacity_retry_after = self.capacity_retry_after if retry_after is None else float(retry_after)
            if steps is not None:
                self.steps = int(steps)
            if tool is not None:
                self.step_tool = tool
            if args is not None:
                self.step_args = args
            if lean is not None:
                self.lean = bool(lean)
        return self

    def stats(self) -> dict:
        with self.lock:
            return {"in_flight": self.in_flight, "max_in_flight": self.max_in_flight, "over_capacity": self.over_capacity,
                    "model_requests": len(self.model_requests()), "capacity": self.capacity, "latency": self.latency}

    def reset_stats(self) -> None:
        with self.lock:
            self.in_flight = self.max_in_flight = self.over_capacity = 0
            self.arrivals.clear()

    def enter(self) -> bool:
        """A model request starts: count it; False when it is over the scripted capacity."""
        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            over = self.capacity is not None and self.in_flight > self.capacity
            self.over_capacity += int(over)
            return not over

    def leave(self) -> None:
        with self.lock:
            self.in_flight -= 1

    def next_behaviour(self, body: dict | None = None) -> dict:
        with self.lock:
            self.served += 1
            if self.script:
                return self.script.pop(0)
        if self.steps > 1 and self.tool_results(body or {}) < self.steps - 1:
            return tool_call(self.step_tool, self.step_args)
        return text("done")

    def tool_results(self, body: dict) -> int:
        """Tool results in the conversation since its last user brief (the wire formats differ)."""
        count = 0
        for message in reversed(body.get("messages") or []):
            role, content = message.get("role"), message.get("content")
            if role == "tool":
                count += 1
            elif role == "user" and isinstance(content, list) and any(
                    isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
                count += sum(1 for b in content if isinstance(b, dict) and b.get("type") == "tool_result")
            elif role == "user":
                break
        return count

    def model_requests(self) -> list[Record]:
        return [r for r in self.requests if r.method == "POST" and not r.path.startswith("/_mock")]

    def start(self) -> "MockVendor":
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       name=f"mock-{self.dialect}", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        if self.thread is not None:
            self.httpd.shutdown()
            self.thread = None
        self.httpd.server_close()

    def __enter__(self) -> "MockVendor":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- vendor hooks (subclasses) ------------------------------------------------------------------
    def authorized(self, headers) -> bool:
        raise NotImplementedError

    def route(self, method: str, path: str) -> str | None:
        """'model', 'models' or None (404)."""
        raise NotImplementedError

    def error_body(self, status: int, message: str, overflow: bool = False) -> dict:
        raise NotImplementedError

    def answer(self, handler: "Handler", record: Record, behaviour: dict) -> None:
        raise NotImplementedError

    def models_body(self) -> dict:
        raise NotImplementedError

    def request_id_header(self) -> str:
        raise NotImplementedError

    # --- plumbing -------------------------------------------------------------------------------
    def _handler(self):
        vendor = self

        class Bound(Handler):
            pass

        Bound.vendor = vendor
        return Bound


class _LeanHeaders(dict):
    """Request headers by lower-cased name (what the handler reads of http.server's message object)."""

    def get(self, name: str, default=None):
        return super().get(name.lower(), default)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so connection reuse is observable (client port)
    # TCP_NODELAY, as a vendor's server (nginx, envoy, uvicorn) sets it: an event stream is small writes,
    # and with Nagle each one after the first waited for the client's delayed ACK on a reused connection
    # (~40 ms a call; a new connection hides it, its first ACKs are quick).
    disable_nagle_algorithm = True
    vendor: MockVendor

    def log_message(self, *args) -> None:
        pass

    def parse_request(self) -> bool:
        """Lean (the fleet bench): the headers are read without http.server's email parser, a third of
        the mock's own CPU per call, taken from the host whose workers it measures. An odd request
        line goes to the standard parser."""
        self.requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        words = self.requestline.split()
        if not self.vendor.lean or len(words) != 3 or words[2] != "HTTP/1.1":
            return super().parse_request()
        self.command, self.path, self.request_version = words
        headers = _LeanHeaders()
        while True:
            line = self.rfile.readline(65537)
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = str(line, "iso-8859-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        self.headers = headers
        self.close_connection = headers.get("connection", "").lower() == "close"
        return True

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        vendor = self.vendor
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        if self.path.startswith("/_mock/"):
            return self._control(method, body)
        record = Record(method, self.path, {k.lower(): v for k, v in self.headers.items()}, body, self.client_address[1])
        if not vendor.lean:
            with vendor.lock:
                vendor.requests.append(record)
        kind = vendor.route(method, self.path.split("?")[0])
        if kind is None:
            return self.send_json(404, vendor.error_body(404, f"no route {method} {self.path}"))
        if not vendor.authorized(record.headers):
            return self.send_json(401, vendor.error_body(401, "invalid api key"))
        if kind == "models":
            return self.send_json(200, vendor.models_body())
        vendor.arrivals.append((time.time(), vendor.tool_results(body if isinstance(body, dict) else {})))
        within = vendor.enter()
        try:
            if not within:
                record.behaviour = {"kind": "over_capacity"}
                return self.send_json(429, vendor.error_body(429, "too many concurrent requests"),
                                      {"Retry-After": str(vendor.capacity_retry_after)})
            if vendor.latency:
                self.pause(record, vendor.latency)
                vendor.late(time.monotonic() - record.started - vendor.latency)
            self._answer(vendor, record, body)
        except ClientGone:
            record.disconnected_at = record.disconnected_at or time.monotonic()
            self.close_connection = True
        finally:
            vendor.leave()
            record.finished_at = time.monotonic()

    def _answer(self, vendor: "MockVendor", record: Record, body) -> None:
        behaviour = record.behaviour = vendor.next_behaviour(body)
        try:
            if behaviour["kind"] == "status":
                extra = {}
                if behaviour.get("retry_after") is not None:
                    extra["Retry-After"] = str(behaviour["retry_after"])
                if behaviour.get("retry_after_ms") is not None:
                    extra["retry-after-ms"] = str(behaviour["retry_after_ms"])
                self.send_json(behaviour["status"], vendor.error_body(behaviour["status"], behaviour["message"],
                                                                      behaviour.get("overflow", False)), extra)
            elif behaviour["kind"] == "raw":
                self.send_raw(behaviour["status"], behaviour["body"].encode("latin-1"), behaviour["content_type"],
                              behaviour["headers"])
            elif behaviour["kind"] == "pings":
                self.start_stream()
                deadline = time.monotonic() + behaviour["seconds"]
                while time.monotonic() < deadline:
                    self.pause(record, behaviour["interval"])
                    if not behaviour["headers_only"]:
                        if vendor.dialect == "anthropic":
                            self.send_event(record, json.dumps({"type": "ping"}), "ping")
                        else:
                            raw = b": keep-alive\n\n"
                            self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
                            self.wfile.flush()
                self.end_stream()
            elif behaviour["kind"] == "frames":
                self.start_stream()
                for piece in behaviour["pieces"]:
                    self.pause(record, behaviour["delay"])
                    self.send_chunk(record, piece.encode("utf-8", "surrogateescape"))  # "\udcff": the byte 0xff
                self.pause(record, behaviour["hold"])
                self.end_stream()
            elif behaviour["kind"] == "hang":
                self.wait_for_disconnect(record, behaviour["seconds"])
            elif behaviour["kind"] == "stream_error" and not (body or {}).get("stream"):
                self.send_json(529, vendor.error_body(529, "Overloaded"))
            elif behaviour["kind"] == "malformed" and not (body or {}).get("stream"):
                self.send_raw(200, b'{"id": "broken", "choices": [', "application/json")
            else:
                vendor.answer(self, record, behaviour)
        except ClientGone:
            record.disconnected_at = record.disconnected_at or time.monotonic()
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError):
            record.disconnected_at = record.disconnected_at or time.monotonic()
            self.close_connection = True

    def _control(self, method: str, body) -> None:
        vendor = self.vendor
        if method == "POST" and self.path == "/_mock/script":
            vendor.push(*(body or []))
            return self.send_json(200, {"queued": len(vendor.script)})
        if self.path == "/_mock/served":
            with vendor.lock:
                lateness = {"late_calls": vendor.late_calls, "late_mean": vendor.late_sum / max(vendor.late_calls, 1),
                            "late_max": vendor.late_max}
            return self.send_json(200, {"served": vendor.served, **lateness})
        if self.path == "/_mock/arrivals":
            return self.send_json(200, {"arrivals": list(vendor.arrivals)})
        if method == "POST" and self.path == "/_mock/reset":
            with vendor.lock:
                vendor.script.clear()
                vendor.requests.clear()
            vendor.reset_stats()
            return self.send_json(200, {"ok": True})
        if method == "POST" and self.path == "/_mock/config":
            body = body or {}
            vendor.configure(**{k: body.get(k) for k in ("latency", "capacity", "retry_after", "steps", "tool", "args", "lean")})
            return self.send_json(200, {**vendor.stats(), "steps": vendor.steps, "lean": vendor.lean})
        if self.path == "/_mock/stats":
            return self.send_json(200, vendor.stats())
        if self.path == "/_mock/requests":
            rows = [{"method": r.method, "path": r.path, "body": r.body, "port": r.port, "behaviour": r.behaviour,
                     "chunks_sent": r.chunks_sent, "disconnected": r.disconnected_at is not None, "usage": r.usage}
                    for r in vendor.requests]
            return self.send_json(200, rows)
        return self.send_json(404, {"error": "unknown control path"})

    # --- writing --------------------------------------------------------------------------------
    def send_raw(self, status: int, data: bytes, content_type: str, extra: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header(self.vendor.request_id_header(), f"req_{id(data):x}{int(time.time() * 1000) % 100000}")
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def send_json(self, status: int, payload, extra: dict | None = None) -> None:
        self.send_raw(status, json.dumps(payload).encode(), "application/json", extra)

    def start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header(self.vendor.request_id_header(), f"req_stream{int(time.time() * 1000) % 100000}")
        self.end_headers()
        self.wfile.flush()

    def send_event(self, record: Record, data: str, event: str | None = None) -> None:
        frame = (f"event: {event}\n" if event else "") + f"data: {data}\n\n"
        self.send_chunk(record, frame.encode())

    def send_chunk(self, record: Record, raw: bytes) -> None:
        """One HTTP chunk of the streamed body, sent at once."""
        if self.client_gone():
            raise ClientGone()
        self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
        self.wfile.flush()
        record.chunks_sent += 1

    def end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def client_gone(self) -> bool:
        """A readable socket that reads b'' is a closed peer (the client aborted its request)."""
        sock = self.connection
        try:
            poller = select.poll()  # not select(): a busy mock has sockets past FD_SETSIZE
            poller.register(sock, select.POLLIN | select.POLLHUP | select.POLLERR)
            if poller.poll(0):
                return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except (OSError, ValueError):
            return True
        return False

    def pause(self, record: Record, seconds: float) -> None:
        """Sleep, but notice a disconnect at once (a cancelled client stops the generation): the wait is
        on the socket, which turns readable when the client hangs up. Polling it every 20 ms cost the
        mock a core's worth of wake-ups with 500 calls in flight, taken from the host it measures."""
        deadline = time.monotonic() + seconds
        poller = select.poll()
        try:
            poller.register(self.connection, select.POLLIN | select.POLLHUP | select.POLLERR)
        except (OSError, ValueError):
            poller = None
        while (left := deadline - time.monotonic()) > 0:
            if poller is not None and not poller.poll(left * 1000):
                continue  # the deadline (or a signal): the loop looks at the clock
            if self.client_gone():
                record.disconnected_at = time.monotonic()
                raise ClientGone()
            time.sleep(min(0.02, max(deadline - time.monotonic(), 0)))  # bytes waiting (a pipelined request): poll

    def wait_for_disconnect(self, record: Record, seconds: float) -> None:
        self.pause(record, seconds)
        self.close_connection = True


def serve_main(vendor_cls, argv=None) -> None:
    """`python -m tests.vendors.mock_openai --port 0 --key K`: print the URL, serve until killed."""
    import argparse

    parser = argparse.ArgumentParser(description=f"mock {vendor_cls.dialect} vendor server with scripted faults")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--key", default="test-key")
    parser.add_argument("--script", default="", help="JSON list of behaviours to queue at start")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before every model answer")
    parser.add_argument("--steps", type=int, default=0, help="calls per conversation (tool calls, then done)")
    parser.add_argument("--lean", action="store_true", help="keep no request records (long benches)")
    args = parser.parse_args(argv)
    vendor = vendor_cls(api_key=args.key, host=args.host, port=args.port)
    vendor.configure(latency=args.latency, steps=args.steps, lean=args.lean)
    if args.script:
        vendor.push(*json.loads(args.script))
    print(vendor.root, flush=True)
    try:
        vendor.httpd.serve_forever()
    except KeyboardInterrupt:
        pass
