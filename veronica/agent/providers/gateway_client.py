"""The workers' side of the model gateway's wire: an httpx2 transport speaking HTTP/1.1 over its socket.

Why not httpx's own transport (httpcore and h11) with `uds=`: both ends of this wire are ours, and
those layers re-validate every header and event in Python for a peer that needs none of it. With a
run pool's hundreds of calls they were a fifth of a pooled worker's CPU per model call
(bench/fleet_profile.py: httpcore 11 %, h11 7.5 %), on a host where that CPU is the fleet's
completion time (bench/fleet.py). Here a request is one join and one send, and the answer is read with
the gateway's own Framing (veronica.agent.providers.gateway), the code that finds where a vendor's
answer ends on the gateway's side, here also unframing its body.

What it keeps of httpx's transport: httpx2 exceptions for every transport failure (ConnectError,
ReadTimeout, ReadError, WriteError, RemoteProtocolError), so the SDKs classify them as before; the
request's timeouts; kept-alive connections (LIFO, at most `keep_alive` idle). What it adds for the run
pool: every socket operation first calls `mark` (sdk: the thread's call can be interrupted by shutting
that socket, or fails at once when it was), and reads are capped by `cap` (sdk.drain).
A kept-alive connection found closed (no byte of an answer) is tried once more on a new one: the
gateway closes none of them while it runs. No gateway at all (not started, or gone): the request goes
straight to the vendor (`direct`), with a warning once.
"""
from __future__ import annotations

import logging
import socket
import threading
from typing import Callable

import httpx2

from veronica.agent.providers.gateway import SCOPE, UPSTREAM, Framing

log = logging.getLogger(__name__)

READ_SIZE = 64 * 1024


class Conn:
    """One connection to the gateway. get_extra_info: what sdk's interrupt asks of a stream."""

    __slots__ = ("sock", "timeout")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.timeout: object = ()  # the socket's timeout now (set only when it changes)

    def get_extra_info(self, info: str):
        return self.sock if info == "socket" else None

    def set_timeout(self, seconds: float | None) -> None:
        if seconds != self.timeout:
            self.sock.settimeout(seconds)
            self.timeout = seconds

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class GatewayTransport(httpx2.BaseTransport):
    def __init__(self, path: str, keep_alive: int, direct: httpx2.BaseTransport, scope: Callable[[], str],
                 mark: Callable[[Conn], None] = lambda conn: None,
                 cap: Callable[[float | None], float | None] = lambda seconds: seconds) -> None:
        self.path, self.keep_alive = path, keep_alive
        self.direct = direct
        self.parts = (direct,)  # (sdk.track_sockets swaps its network backend into the direct way)
        self.scope, self.mark, self.cap = scope, mark, cap
        self._idle: list[Conn] = []
        self._lock = threading.Lock()
        self._closed = False
        self.warned = False

    # --- a request ------------------------------------------------------------------------------------
    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        url = request.url
        if url.scheme not in ("http", "https") or not isinstance(request.stream, httpx2.ByteStream):
            return self.direct.handle_request(request)
        timeout = request.extensions.get("timeout") or {}
        wire = self.wire(request)
        conn = self._take()
        reused = conn is not None
        while True:
            if conn is None:
                try:
                    conn = self._connect(timeout.get("connect"))
                except httpx2.ConnectError as exc:  # no gateway: nothing was sent
                    if not self.warned:
                        self.warned = True
                        log.warning("the model gateway at %s does not answer (%s): calling the vendor directly", self.path, exc)
                    return self.direct.handle_request(request)
            frame = Framing(head_only=request.method == "HEAD", decode=True)
            try:
                state = self._exchange(conn, wire, frame, timeout, reused)
            except _Stale:
                conn.close()
                conn, reused = None, False
                continue
            except BaseException:
                conn.close()
                raise
            if state == "error":
                conn.close()
                raise httpx2.RemoteProtocolError("the model gateway's answer is malformed", request=request)
            return httpx2.Response(frame.status, headers=frame.fields,
                                   stream=Body(self, conn, frame, state, self.cap(timeout.get("read"))),
                                   extensions={"http_version": b"HTTP/1.1", "reason_phrase": frame.reason})

    def wire(self, request: httpx2.Request) -> bytes:
        """The request as the gateway reads it: the vendor's request, plus where it goes and whose it is."""
        url = request.url
        port = url.port or (443 if url.scheme == "https" else 80)
        host = f"[{url.host}]" if ":" in url.host else url.host  # an IPv6 address
        lines = [b"%s %s HTTP/1.1" % (request.method.encode("ascii"), url.raw_path)]
        lines += [b"%s: %s" % pair for pair in request.headers.raw]
        lines.append(f"{UPSTREAM}: {url.scheme}://{host}:{port}".encode("ascii"))
        whose = self.scope()
        if whose:
            lines.append(f"{SCOPE}: {whose}".encode())
        return b"\r\n".join(lines) + b"\r\n\r\n" + request.read()

    def _exchange(self, conn: Conn, wire: bytes, frame: Framing, timeout: dict, reused: bool) -> str:
        """Send the request and read the answer's head: "more" (its body follows), "done" or "error".
        _Stale: a kept-alive connection that was closed before any of the answer came."""
        sending, got = True, False
        try:
            self.mark(conn)
            conn.set_timeout(timeout.get("write"))
            conn.sock.sendall(wire)
            sending = False
            state = "more"
            while frame.status is None and state == "more":
                self.mark(conn)
                conn.set_timeout(self.cap(timeout.get("read")))
                data = conn.sock.recv(READ_SIZE)
                if not data:
                    if reused and not got:
                        raise _Stale()
                    raise httpx2.RemoteProtocolError("the model gateway closed the connection without an answer")
                got = True
                state = frame.feed(data)
            return state
        except (BrokenPipeError, ConnectionResetError) as exc:
            if reused and not got:
                raise _Stale() from exc
            raise (httpx2.WriteError if sending else httpx2.ReadError)(str(exc)) from exc
        except socket.timeout as exc:
            raise (httpx2.WriteTimeout if sending else httpx2.ReadTimeout)(str(exc)) from exc
        except ConnectionAbortedError:
            raise  # sdk's mark: this thread's call was interrupted
        except OSError as exc:
            raise (httpx2.WriteError if sending else httpx2.ReadError)(str(exc)) from exc

    # --- connections ----------------------------------------------------------------------------------
    def _connect(self, seconds: float | None) -> Conn:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(seconds)
            sock.connect(self.path)
        except OSError as exc:
            sock.close()
            raise httpx2.ConnectError(str(exc)) from exc
        conn = Conn(sock)
        conn.timeout = seconds
        return conn

    def _take(self) -> Conn | None:
        with self._lock:
            return self._idle.pop() if self._idle else None

    def give_back(self, conn: Conn) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self.keep_alive:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        self.direct.close()


class _Stale(Exception):
    """A kept-alive connection closed before the answer began: the request goes again on a new one."""


class Body(httpx2.SyncByteStream):
    """An answer's body, unframed as it is read; its connection is kept alive when it was read to its end."""

    def __init__(self, transport: GatewayTransport, conn: Conn, frame: Framing, state: str, read_timeout) -> None:
        self.transport, self.conn, self.frame, self.state = transport, conn, frame, state
        self.read_timeout = read_timeout

    def __iter__(self):
        frame, transport = self.frame, self.transport
        while True:
            if frame.payload:
                pieces = list(frame.payload)
                frame.payload.clear()
                yield from pieces
            if self.state == "done":
                return
            if self.state == "error":
                raise httpx2.RemoteProtocolError("the model gateway's answer is malformed")
            conn = self.conn
            if conn is None:
                raise httpx2.StreamClosed()
            transport.mark(conn)
            try:
                conn.set_timeout(transport.cap(self.read_timeout))
                data = conn.sock.recv(READ_SIZE)
            except socket.timeout as exc:
                raise httpx2.ReadTimeout(str(exc)) from exc
            except ConnectionAbortedError:
                raise
            except OSError as exc:
                raise httpx2.ReadError(str(exc)) from exc
            if not data:
                if frame.until_close:
                    self.state = "done"
                    continue
                raise httpx2.RemoteProtocolError("peer closed connection without sending complete message body")
            self.state = frame.feed(data)

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is None:
            return
        if self.state == "done" and self.frame.keep_alive:
            self.transport.give_back(conn)
        else:
            conn.close()
