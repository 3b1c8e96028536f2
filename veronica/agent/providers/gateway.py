"""A host's model gateway: one process per host (a qcluster) that holds its workers' vendor streams, so
a model call outlives the worker that made it (issue 25, a worker SIGKILLed mid-way).

Why a process: a worker's run pool waits on hundreds of model calls at once. When that worker dies its
calls die with its sockets, and whoever resumes its runs pays every call in flight again: 2 s of a
scripted model for each, and the vendor's tokens twice. The gateway is a child of the cluster's
sentinel, which survives its workers; it dies with its host, as the calls did before.

The wire: a worker's HTTP client sends each vendor request over the gateway's Unix socket
(veronica.agent.providers.gateway_client), unchanged but for two headers: where it goes
(`x-veronica-upstream`: scheme, host, port) and whose call it is (`x-veronica-scope`: the member, set
by the agent loop; sdk.call_scope). The gateway
sends it upstream (its own pooled connections, TLS where the upstream is https) and relays the
response's bytes as they come, keeping them until the call is over.

When the worker's connection closes before the response has ended, the gateway asks whether that
worker still runs (its pid from SO_PEERCRED, its start time from /proc, as holders.mark_gone does):
* it runs: the call was cancelled (an operator's stop, an interrupt): the upstream stream is closed at
  once, as a direct call's would have been;
* it died: the call is kept (an orphan) and goes on to its end, for KEEP_ORPHAN seconds. The first
  request of the same member for the same body (the resumed run rebuilds the same request from the
  database) takes it over: it gets what was relayed so far, then the rest as it comes. One call, one
  reply, billed once, by the run that stores it.
A worker can also die after reading an answer in full but before storing it (a pooled worker on a busy
host spends a while between the two). So each member's last answer is kept for KEEP_ANSWERED seconds,
with the worker that read it: the same member's identical request gets it only if that worker has died
since; a live worker asking the same again gets a new call.
A request that matches neither is a new call: two live runs never share a call, even with the same
body. An answer that is not a success (status >= 400) is never kept for anyone.

Access: the socket is in a 0700 folder of the cluster's user (mkdtemp); the sandbox's /tmp is its own
tmpfs, so a tenant's tool never sees it. Every byte stays on the host.
Run: python -m veronica.agent.providers.gateway <socket path>. No Django: it starts in ~0.1 s.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import signal
import socket
import struct
import sys
import time
from urllib.parse import urlsplit

from veronica.plumbing import procstat


log = logging.getLogger(__name__)

SOCKET_ENV = "VERONICA_MODEL_GATEWAY_SOCKET"  # set by the sentinel for the workers it forks
UPSTREAM = "x-veronica-upstream"
SCOPE = "x-veronica-scope"
MAX_HEAD = 64 * 1024
MAX_BODY = 64 * 2**20
KEEP_ORPHAN = 120.0  # a lease (10 s by default) plus the resume's claim, with room to spare
KEEP_ANSWERED = 60.0  # a member's last answer, read in full by a worker that may die before storing it
MAX_ORPHAN_BYTES = 64 * 2**20
DEATH_GRACE = 0.1  # a last look for a dying worker (gone() sees one at once): a live one's hang-up is a cancel


# --- the gateway -------------------------------------------------------------------------------------
# Protocols, not streams, and the response's bytes relayed as they come (the vendor's own framing, read
# only far enough to know where the answer ends): a call costs the gateway a few callbacks. The first
# version (asyncio streams, h11, re-framed) cost 1.2 ms of CPU a call and doubled the 500-member bench.

class Call:
    """One upstream call: the response bytes relayed so far, whether it is over, and the worker
    connection it is relayed to now (None: orphaned, or not yet taken)."""

    def __init__(self, key: str, scope: str = "") -> None:
        self.key, self.scope = key, scope
        self.pieces: list[bytes] = []
        self.size = 0
        self.done = False
        self.failed = False  # the upstream broke off: the reader's connection is closed unfinished
        self.kept = True  # False: an answer that is not a success, never handed to another run
        self.reader: "WorkerSide | None" = None
        self.task: asyncio.Task | None = None  # connecting and sending
        self.upstream: "UpstreamSide | None" = None
        self.orphaned_at: float | None = None
        self.request: tuple | None = None  # (upstream, bytes, head only) while a kept-alive connection carries it

    def add(self, piece: bytes) -> None:
        self.pieces.append(piece)
        self.size += len(piece)
        if self.reader is not None:
            self.reader.transport.write(piece)

    def end(self, failed: bool = False) -> None:
        if self.done:
            return
        self.done, self.failed, self.request = True, failed, None
        if self.reader is not None:
            self.reader.answered(self)

    def cancel(self) -> None:
        """Hang up on the vendor (a cancelled call, or an orphan nobody took)."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.abort()
        self.end(failed=True)


class WorkerSide(asyncio.Protocol):
    """A worker's connection: requests one after another (kept alive), each answer relayed as it comes."""

    def __init__(self, gateway: "Gateway") -> None:
        self.gateway = gateway
        self.buffer = bytearray()
        self.call: Call | None = None
        self.peer = None
        self.transport = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.peer = peer_mark(transport.get_extra_info("socket"))

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.call is not None:  # the next request, sent before this answer ended: taken after it
            return
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > MAX_HEAD:
                self.refuse(f"request head over {MAX_HEAD} bytes")
            return
        if end + 4 > MAX_HEAD:
            return self.refuse(f"request head over {MAX_HEAD} bytes")
        request = parse_request(bytes(self.buffer[:end + 4]))
        if isinstance(request, str):
            return self.refuse(request)
        method, target, headers, length, lines = request
        if length > MAX_BODY:
            return self.refuse(f"request body over {MAX_BODY} bytes")
        if len(self.buffer) < end + 4 + length:
            return  # the body is still coming
        body = bytes(self.buffer[end + 4:end + 4 + length])
        del self.buffer[:end + 4 + length]
        upstream = check_upstream(header(headers, UPSTREAM))
        if isinstance(upstream, str):
            return self.refuse(upstream)
        scope = header(headers, SCOPE)
        ours = (UPSTREAM.encode(), SCOPE.encode())
        head = b"\r\n".join(line for line in lines if line.split(b":", 1)[0].strip().lower() not in ours) + b"\r\n\r\n"
        key = call_key(scope, method, target, headers, body) if scope else ""
        self.gateway.start(self, scope, key, upstream, head + body, method == b"HEAD")

    def relay(self, call: Call) -> None:
        self.call = call
        call.reader = self
        for piece in call.pieces:
            self.transport.write(piece)
        if call.done:
            self.answered(call)

    def answered(self, call: Call) -> None:
        call.reader = None
        self.call = None
        if call.key and call.kept and not call.failed:
            self.gateway.answered[call.scope] = (call, self.peer, time.monotonic())
        if call.failed:
            self.transport.abort()  # the worker reads a broken connection, as from the vendor itself
        elif self.buffer:
            self.data_received(b"")

    def connection_lost(self, exc) -> None:
        call, self.call = self.call, None
        if call is not None:
            call.reader = None
            asyncio.ensure_future(self.gateway.left(call, self.peer))

    def refuse(self, why: str) -> None:
        body = why.encode()
        self.transport.write(b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\nconnection: close\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(body), body))
        self.transport.close()
        self.buffer.clear()


class UpstreamSide(asyncio.Protocol):
    """A connection to a vendor: one call at a time, its answer's end found from its framing."""

    def __init__(self, gateway: "Gateway", upstream: tuple) -> None:
        self.gateway, self.upstream = gateway, upstream
        self.transport = None
        self.call: Call | None = None
        self.frame: Framing | None = None
        self.reused = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def send(self, call: Call, request: bytes, head_only: bool) -> None:
        self.call, self.frame = call, Framing(head_only)
        call.upstream = self
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        call = self.call
        if call is None:
            return self.transport.abort()  # bytes nobody asked for
        status = self.frame.feed(data)
        if call.kept and (self.frame.status or 0) >= 400:
            call.kept = False
        call.add(data)
        if status == "error":
            self.call = None
            self.transport.abort()
            call.end(failed=True)
        elif status == "done":
            self.call = None
            call.upstream = None
            call.end()
            if self.frame.keep_alive:
                self.gateway.idle.setdefault(self.upstream, []).append(self)
            else:
                self.transport.close()

    def connection_lost(self, exc) -> None:
        call, self.call = self.call, None
        self.transport = None
        if call is not None:
            if self.frame is not None and self.frame.until_close and self.frame.status is not None:
                call.end()  # an answer framed by the connection's end
            elif call.size == 0 and self.reused and call.request is not None:
                self.gateway.resend(call)  # a kept-alive connection the vendor had closed: once more, on a new one
            else:
                call.end(failed=True)


class Framing:
    """Where an HTTP/1.1 response ends: its head, then a content-length, chunks, or the connection's end."""

    def __init__(self, head_only: bool = False, decode: bool = False) -> None:
        self.head = bytearray()
        self.status: int | None = None
        self.reason = b""
        self.fields: list[tuple[bytes, bytes]] = []  # the head's fields as sent (decode only)
        # decode: the body's bytes, unframed, are put here as they come (the worker's side reads the
        # answer; the gateway itself relays the framed bytes and only needs to know where they end)
        self.payload: list[bytes] | None = [] if decode else None
        self.head_only = head_only
        self.keep_alive = True
        self.until_close = False
        self.left = 0  # body bytes still to come (content-length), or of the current chunk and its CRLF
        self.chunked = False
        self.line = bytearray()  # a chunk-size line (or the trailer) being read
        self.trailer = False

    def feed(self, data: bytes) -> str:
        """"more", "done" or "error"."""
        at = 0
        if self.status is None:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return "error" if len(self.head) > MAX_HEAD else "more"
            verdict = self._head(bytes(self.head[:end]))
            rest = bytes(self.head[end + 4:])
            self.head.clear()
            if verdict != "more":
                return verdict
            if self.status is None:  # an interim answer (1xx): the real one follows
                return self.feed(rest) if rest else "more"
            data, at = rest, 0
        if self.payload is not None and data and not self.chunked:
            self.payload.append(data)
        if self.until_close:
            return "more"
        if not self.chunked:
            self.left -= len(data)
            return "done" if self.left == 0 else ("error" if self.left < 0 else "more")
        return self._chunks(data, at)

    def _head(self, head: bytes) -> str:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        try:
            self.status = int(parts[1])
        except (IndexError, ValueError):
            return "error"
        fields = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            fields[name.strip().lower()] = value.strip().lower()
        if 100 <= self.status < 200:  # an interim answer: the real head follows
            self.status = None
            return "more"
        if self.payload is not None:
            self.reason = parts[2] if len(parts) > 2 else b""
            self.fields = [(name.strip(), value.strip()) for name, _, value in (line.partition(b":") for line in lines[1:])]
        self.keep_alive = fields.get(b"connection") != b"close" and parts[0] == b"HTTP/1.1"
        if self.head_only or self.status in (204, 304):
            return "done"
        if b"chunked" in fields.get(b"transfer-encoding", b""):
            self.chunked = True
            return "more"
        if b"content-length" in fields:
            try:
                self.left = int(fields[b"content-length"])
            except ValueError:
                return "error"
            return "done" if self.left == 0 else "more"
        self.until_close, self.keep_alive = True, False
        return "more"

    def _chunks(self, data: bytes, at: int) -> str:
        n = len(data)
        while at < n:
            if self.left:
                step = min(self.left, n - at)
                if self.payload is not None and self.left > 2:  # (the last two are the chunk's CRLF)
                    data_end = at + min(step, self.left - 2)
                    self.payload.append(data[at:data_end])
                self.left -= step
                at += step
                continue
            end = data.find(b"\n", at)
            if end < 0:
                self.line += data[at:]
                return "error" if len(self.line) > 4096 else "more"
            self.line += data[at:end + 1]
            at = end + 1
            line = bytes(self.line).strip()
            self.line.clear()
            if self.trailer:
                if not line:
                    return "done"
                continue
            try:
                size = int(line.split(b";", 1)[0], 16)
            except ValueError:
                return "error"
            if size == 0:
                self.trailer = True
            else:
                self.left = size + 2  # the data and its CRLF
        return "more"


class Gateway:
    def __init__(self) -> None:
        self.orphans: dict[str, Call] = {}
        self.idle: dict[tuple, list[UpstreamSide]] = {}
        # per member, the last answer relayed in full: its worker may die before the answer is stored
        self.answered: dict[str, tuple[Call, tuple | None, float]] = {}
        self.stats = {"calls": 0, "taken_over": 0, "orphaned": 0, "answered_to_the_dead": 0, "cancelled": 0, "expired": 0}
        self._ssl = None

    def start(self, worker: WorkerSide, scope: str, key: str, upstream: tuple, request: bytes, head_only: bool) -> None:
        call = (self.orphans.pop(key, None) or self.answered_to_the_dead(scope, key)) if key else None
        if call is not None:
            call.orphaned_at = None
            self.stats["taken_over"] += 1
        else:
            call = Call(key, scope)
            self.stats["calls"] += 1
            self.send(call, upstream, request, head_only)
        worker.relay(call)

    def send(self, call: Call, upstream: tuple, request: bytes, head_only: bool, fresh: bool = False) -> None:
        pool = self.idle.get(upstream) or []
        while pool and not fresh:
            side = pool.pop()
            if side.transport is not None and not side.transport.is_closing():
                side.reused = True
                call.request = (upstream, request, head_only)  # to send again if the vendor had closed it
                side.send(call, request, head_only)
                return
        call.request = None
        call.task = asyncio.ensure_future(self.connect(call, upstream, request, head_only))

    def resend(self, call: Call) -> None:
        upstream, request, head_only = call.request
        self.send(call, upstream, request, head_only, fresh=True)

    async def connect(self, call: Call, upstream: tuple, request: bytes, head_only: bool) -> None:
        scheme, host, port = upstream
        tls = self.tls() if scheme == "https" else None
        try:
            _, side = await asyncio.get_running_loop().create_connection(
                lambda: UpstreamSide(self, upstream), host, port, ssl=tls, server_hostname=host if tls else None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the worker reads a broken connection, as going direct
            log.info("upstream %s:%s failed: %s", host, port, exc)
            call.end(failed=True)
            return
        if call.done:  # cancelled while it connected
            side.transport.close()
            return
        side.send(call, request, head_only)

    def answered_to_the_dead(self, scope: str, key: str) -> Call | None:
        """The member's last answer, if this very request had it and the worker that read it has died
        since (before it could store it): the resumed run gets it instead of asking the vendor again.
        A live worker asking the same again gets a new call."""
        last = self.answered.pop(scope, None)
        if last is None:
            return None
        call, peer, when = last
        if call.key != key or time.monotonic() - when > KEEP_ANSWERED or peer is None or not gone(peer):
            return None
        self.stats["answered_to_the_dead"] += 1
        return call

    async def left(self, call: Call, peer) -> None:
        """The worker's connection closed before the end of its answer: cancelled, or its worker died."""
        if call.key and call.kept and await died(peer):
            call.orphaned_at = time.monotonic()
            self.orphans[call.key] = call
            self.stats["orphaned"] += 1
            self.trim()
            return
        if not call.done:
            call.cancel()
            self.stats["cancelled"] += 1

    def trim(self) -> None:
        """Orphans past KEEP_ORPHAN, and the oldest beyond MAX_ORPHAN_BYTES, are dropped."""
        now = time.monotonic()
        total = 0
        for key, call in sorted(self.orphans.items(), key=lambda kv: -(kv[1].orphaned_at or 0)):
            total += call.size
            if now - (call.orphaned_at or now) > KEEP_ORPHAN or total > MAX_ORPHAN_BYTES:
                del self.orphans[key]
                self.stats["expired"] += 1
                if not call.done:
                    call.cancel()
        for scope in [scope for scope, (_, _, when) in self.answered.items() if now - when > KEEP_ANSWERED]:
            del self.answered[scope]

    async def sweep(self) -> None:
        while True:
            await asyncio.sleep(5)
            self.trim()

    def tls(self):
        if self._ssl is None:
            import httpx2

            self._ssl = httpx2.create_ssl_context()  # what the workers' clients verify with
        return self._ssl


# --- pieces --------------------------------------------------------------------------------------------

def parse_request(head: bytes):
    """(method, target, headers, content length) of a request head, or what is wrong with it."""
    lines = head[:-4].split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        return "not an HTTP/1.1 request line"
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            return "malformed header line"
        headers.append((name.lower(), value.strip()))
    if header(headers, "transfer-encoding"):
        return "a chunked request body is not taken (send content-length)"
    try:
        length = int(header(headers, "content-length") or b"0")
    except ValueError:
        return "content-length is not a number"
    if length < 0:
        return "content-length is negative"
    return parts[0], parts[1], headers, length, lines


def header(headers, name: str) -> str:
    wanted = name.encode()
    for k, v in headers:
        if k == wanted:
            return v.decode("latin-1")
    return ""


def check_upstream(value: str):
    parts = urlsplit(value)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        return f"{UPSTREAM} must be scheme://host:port (http or https)"
    return parts.scheme, parts.hostname, port


def call_key(scope: str, method: bytes, target: bytes, headers, body: bytes) -> str:
    """Whose call, to where, with which credentials, of what: a resumed run's identical request matches."""
    digest = hashlib.sha256()
    for part in (scope.encode(), method, target, header(headers, "host").encode(),
                 header(headers, "authorization").encode(), header(headers, "x-api-key").encode(), body):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def peer_mark(sock) -> tuple[int, int] | None:
    """(pid, start time) of the process at the other end of a Unix socket."""
    try:
        pid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
    except (OSError, AttributeError):
        return None
    return peer_mark_of(pid)


def peer_mark_of(pid: int) -> tuple[int, int] | None:
    now = procstat.stat(pid)
    return (pid, now.start) if now else None


def gone(mark: tuple[int, int]) -> bool:
    """The process has died or is dying: a SIGKILLed worker's sockets close as its last thread exits,
    when its main thread is already marked exiting, so this is true by the time the gateway reads EOF."""
    return procstat.gone(*mark, exiting=True)


async def died(mark) -> bool:
    """Whether the worker at the other end has died (waiting DEATH_GRACE for /proc to say so)."""
    if mark is None:
        return False
    deadline = time.monotonic() + DEATH_GRACE
    while True:
        if gone(mark):
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.02)


# --- started by a host's sentinel -------------------------------------------------------------------------

START_SECONDS = 10.0


def spawn(folder: str | None = None):
    """Start this host's gateway (a child of the calling process, in its process group: it dies with its
    host) and point the workers forked from here at it. None when it could not start: the workers call
    their vendors directly, as without it. folder: a dead gateway's, whose socket the workers know
    (respawn)."""
    import shutil
    import subprocess
    import tempfile

    made = folder is None
    folder = folder or tempfile.mkdtemp(prefix="veronica-gateway-")  # 0700: only this user's processes reach the socket
    path = os.path.join(folder, "socket")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    process = subprocess.Popen([sys.executable, "-m", "veronica.agent.providers.gateway", path], env=env,
                               stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline and process.poll() is None:
        if answers(path):
            os.environ[SOCKET_ENV] = path
            process.folder = folder
            return process
        time.sleep(0.02)
    log.warning("the model gateway did not start; workers call their vendors directly")
    process.kill()
    process.wait()
    if made:
        shutil.rmtree(folder, ignore_errors=True)
    return None


def respawn(process):
    """The host's gateway `process` has exited (it should not: a bug, the OOM killer): a new one on the
    same socket, so the workers' next connections reach it (meanwhile they call the vendors directly,
    gateway_client). The calls the dead one held are lost, as a dead worker's were before the gateway.
    Returns the new process, or the dead one when none started (the caller tries again later)."""
    log.error("the model gateway (pid %s) exited with status %s; starting a new one", process.pid, process.returncode)
    new = spawn(process.folder)
    return new if new is not None else process


def answers(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def stop(process) -> None:
    """The host's cluster stopped: its gateway ends (after its workers, whose calls are over)."""
    import shutil

    if process is None:
        return
    os.environ.pop(SOCKET_ENV, None)
    process.terminate()
    try:
        process.wait(5)
    except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired
        process.kill()
        process.wait()
    shutil.rmtree(process.folder, ignore_errors=True)


# --- the process ---------------------------------------------------------------------------------------

async def main(path: str) -> None:
    gateway = Gateway()
    if os.path.exists(path):
        os.unlink(path)
    server = await asyncio.get_running_loop().create_unix_server(lambda: WorkerSide(gateway), path=path)
    os.chmod(path, 0o600)
    sweep = asyncio.ensure_future(gateway.sweep())
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    parent = os.getppid()
    async with server:
        while os.getppid() == parent and not stop.is_set():  # its sentinel gone, so is its host
            try:
                await asyncio.wait_for(stop.wait(), 1)
            except asyncio.TimeoutError:
                pass
    sweep.cancel()
    log.info("%s", {**gateway.stats, "untaken": len(gateway.orphans)})


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s model gateway: %(message)s")
    try:
        asyncio.run(main(sys.argv[1]))
    except KeyboardInterrupt:
        pass
