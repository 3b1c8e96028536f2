"""MCP client connections, one per server per worker process, on their own event-loop thread.

The SDK (`mcp`) is async and a connection's context must open and close in one task, so each
server gets a long-lived task that holds its `Client` open and serves requests from a queue; the
run's (sync) thread submits a request and waits with the server's timeout. A connection that died
(the stdio process exited, the HTTP peer went away) is dropped and the next request starts a new
one: servers are restarted when they die. A forked worker starts its own manager (pid check)."""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from veronica.agent.runctx import stop_requested
from veronica.agent.tools.sandbox import Capped

if TYPE_CHECKING:
    from mcp import Client
    from mcp.types import CallToolResult
    from mcp.types import Tool as McpToolInfo

# The MCP SDK is imported on first use, not with this module: its protocol types are ~1 CPU-s of
# pydantic models, which every worker paid at start-up (and a host at load 8 paid for seconds) though
# most members never reach an MCP server.

log = logging.getLogger(__name__)
STDERR_TAIL = 600  # characters of a failed server's stderr shown in its error
STDERR_KEPT = 4096  # bytes of a server's stderr kept at each end; the middle is counted, never held
POLL_SECONDS = 0.05  # how often a waiting call looks at the run's stop event


class McpUnavailable(Exception):
    """The server could not be started, listed or reached; the text is shown in the console."""


class McpCancelled(McpUnavailable):
    """The run was asked to stop while the call was in flight."""


class NotSent(McpUnavailable):
    """The connection ended before this request went out: safe to send again on a new one."""


@dataclass(frozen=True)
class ServerSpec:
    """Everything a connection depends on: change any of it and the connection is rebuilt."""

    key: int  # the McpServer row
    name: str
    transport: str  # "stdio" | "http"
    argv: tuple[str, ...] = ()  # already wrapped by the sandbox
    cwd: str = ""
    url: str = ""
    env: tuple[tuple[str, str], ...] = ()
    timeout: int = 30


@contextlib.asynccontextmanager
async def _guarded_http(url: str):
    """The SDK's streamable-HTTP transport on a client that refuses internal addresses at connect
    time (veronica.ops.outbound, VERONICA_MCP_ALLOW_HOSTS); we own the client, so we close it."""
    import httpx2

    from veronica.ops import outbound

    from mcp.client.streamable_http import streamable_http_client

    async with outbound.async_client_factory(outbound.MCP)(httpx2.Timeout(30, read=300)) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            yield streams


def connection_lost(exc: BaseException) -> bool:
    if isinstance(exc, McpCancelled):
        return False  # the run stopped it: never retried on a new connection
    from mcp import MCPError
    from mcp.types import CONNECTION_CLOSED

    return not isinstance(exc, MCPError) or exc.error.code == CONNECTION_CLOSED


class _Connection:
    def __init__(self, spec: ServerSpec, loop: asyncio.AbstractEventLoop) -> None:
        self.spec, self.loop = spec, loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.ready: concurrent.futures.Future = concurrent.futures.Future()
        self.dead = False
        self.stderr = Capped(STDERR_KEPT, STDERR_KEPT)
        self.errlog = self.err_read = None
        if spec.transport == "stdio":  # a pipe drained by the loop as the server writes, not a file read whole
            read_fd, write_fd = os.pipe()
            os.set_blocking(read_fd, False)
            self.err_read, self.errlog = read_fd, os.fdopen(write_fd, "w")
        self.task = asyncio.run_coroutine_threadsafe(self._serve(), loop)

    def _drain_stderr(self) -> bool:
        """One read of what the server wrote to stderr; False when nothing more is there now."""
        try:
            data = os.read(self.err_read, 65536)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if data:
            self.stderr.feed(data)
            return True
        self._close_stderr()  # every writer is gone: the server and its children have exited
        return False

    def _drain_all(self) -> None:
        for _ in range(256):  # bounded: a server still writing cannot keep us here
            if self.err_read is None or not self._drain_stderr():
                return

    def _close_stderr(self) -> None:
        if self.err_read is not None:
            self.loop.remove_reader(self.err_read)
            os.close(self.err_read)
            self.err_read = None

    def _spawned(self) -> None:
        """The server holds its stderr now: ours is closed, so the pipe ends when the server does."""
        if self.errlog is not None:
            self.errlog.close()

    def _server(self):
        if self.spec.transport == "http":
            return _guarded_http(self.spec.url)
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        params = StdioServerParameters(command=self.spec.argv[0], args=list(self.spec.argv[1:]), env=dict(self.spec.env),
                                       cwd=self.spec.cwd or None)
        return stdio_client(params, errlog=self.errlog)

    async def _serve(self) -> None:
        if self.err_read is not None:
            self.loop.add_reader(self.err_read, self._drain_stderr)
        from mcp import Client

        try:
            async with Client(self._server(), read_timeout_seconds=self.spec.timeout, cache=None) as client:
                self._spawned()
                self.ready.set_result(True)
                while True:
                    op, fut = await self.queue.get()
                    if op is None:
                        return
                    try:
                        fut.set_result(await op(client))
                    except Exception as exc:  # handed to the caller; a lost connection also ends this one
                        lost = connection_lost(exc)
                        self.dead = self.dead or lost  # before the caller wakes: its next request starts afresh
                        fut.set_exception(exc)
                        if lost:
                            return
        except BaseException as exc:
            self._drain_all()  # the server's last words, for the message
            if not self.ready.done():
                self.ready.set_exception(McpUnavailable(self.describe(exc)))
            if not isinstance(exc, (Exception, asyncio.CancelledError)):
                raise
        finally:
            self.dead = True
            self._spawned()
            self._drain_all()
            self.loop.call_later(1, self._close_stderr)  # a straggler's writes no longer matter
            while not self.queue.empty():
                _, fut = self.queue.get_nowait()
                if fut is not None and not fut.done():
                    fut.set_exception(NotSent(f"MCP server '{self.spec.name}' stopped"))

    def describe(self, exc: BaseException) -> str:
        detail = str(exc) or type(exc).__name__
        if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            detail = "; ".join(str(e) or type(e).__name__ for e in exc.exceptions)
        text = f"MCP server '{self.spec.name}' could not start: {detail}"
        tail = self.stderr_tail()
        return text + (f" (stderr: {tail})" if tail else "")

    def stderr_tail(self) -> str:
        return self.stderr.text()[-STDERR_TAIL:].strip()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.spec.timeout
        while True:
            try:
                self.ready.result(timeout=POLL_SECONDS)
                return
            except concurrent.futures.TimeoutError:
                pass
            if stop_requested():
                self.close()
                raise McpCancelled(f"cancelled: the run was asked to stop while MCP server '{self.spec.name}' started") from None
            if time.monotonic() > deadline:
                self.close()
                raise McpUnavailable(f"MCP server '{self.spec.name}' did not start within {self.spec.timeout}s") from None

    def submit(self, op: Callable[[Client], Awaitable[Any]]) -> Any:
        if self.dead:
            raise NotSent(f"MCP server '{self.spec.name}' stopped")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (op, fut))
        deadline = time.monotonic() + self.spec.timeout + 5  # the SDK times the call out itself; this is the backstop
        while True:
            try:
                return fut.result(timeout=POLL_SECONDS)
            except concurrent.futures.TimeoutError:
                pass
            if stop_requested():  # the run was suspended or removed: end the call (and the server) now
                self.close()
                raise McpCancelled(f"cancelled: the run was asked to stop; the call to MCP server '{self.spec.name}' "
                                   "was abandoned and the server stopped") from None
            if time.monotonic() > deadline:
                self.close()
                raise McpUnavailable(f"MCP server '{self.spec.name}' did not answer within {self.spec.timeout}s") from None

    def close(self) -> None:
        self.dead = True
        self.task.cancel()


class Manager:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="mcp-clients", daemon=True)
        self.thread.start()
        self.connections: dict[int, _Connection] = {}
        self.lock = threading.Lock()

    def connection(self, spec: ServerSpec) -> _Connection:
        with self.lock:
            conn = self.connections.get(spec.key)
            if conn is not None and (conn.dead or conn.spec != spec):
                conn.close()
                conn = None
            if conn is None:
                conn = self.connections[spec.key] = _Connection(spec, self.loop)
        conn.wait_ready()
        return conn

    def list_tools(self, spec: ServerSpec) -> list[McpToolInfo]:
        async def listing(client: Client) -> list[McpToolInfo]:
            tools, cursor = [], None
            for _ in range(50):  # a paginator that never ends cannot hang the run
                page = await client.list_tools(cursor=cursor)
                tools += page.tools
                cursor = page.next_cursor
                if not cursor:
                    break
            return tools

        try:
            return self.connection(spec).submit(listing)
        except McpUnavailable:
            raise
        except Exception as exc:
            raise McpUnavailable(f"MCP server '{spec.name}' could not list its tools: {exc}") from None

    def call(self, spec: ServerSpec, tool: str, args: dict, *, read_only: bool) -> CallToolResult:
        """One call. A server found dead is restarted first; a read-only call that lost its
        connection is retried once on a fresh one (a mutating call is not: it may have run)."""
        conn = self.connection(spec)
        if not read_only:
            try:
                conn.submit(lambda client: client.list_tools())  # the liveness probe (ping is gone in 2026-07-28)
            except Exception as exc:
                if not connection_lost(exc):
                    raise
                conn = self.connection(spec)  # found dead before the call was sent: restarted
        for attempt in (1, 2):
            try:
                return conn.submit(lambda client: client.call_tool(tool, args, read_timeout_seconds=spec.timeout))
            except Exception as exc:
                if not (attempt == 1 and (isinstance(exc, NotSent) or read_only and connection_lost(exc))):
                    raise
                conn = self.connection(spec)
        raise AssertionError("unreachable")

    def close_all(self) -> None:
        with self.lock:
            for conn in self.connections.values():
                conn.close()
            self.connections.clear()


_manager: Manager | None = None
_manager_lock = threading.Lock()


def manager() -> Manager:
    global _manager
    with _manager_lock:
        if _manager is None or _manager.pid != os.getpid():  # a forked worker cannot use its parent's loop thread
            _manager = Manager()
        return _manager
