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
import tempfile
import threading
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from mcp import Client, MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CONNECTION_CLOSED, CallToolResult
from mcp.types import Tool as McpToolInfo

log = logging.getLogger(__name__)
STDERR_TAIL = 600  # characters of a failed server's stderr shown in its error


class McpUnavailable(Exception):
    """The server could not be started, listed or reached; the text is shown in the console."""


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
    time (veronica.outbound, VERONICA_MCP_ALLOW_HOSTS); we own the client, so we close it."""
    import httpx2

    from veronica import outbound

    async with outbound.async_client_factory(outbound.MCP)(httpx2.Timeout(30, read=300)) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            yield streams


def connection_lost(exc: BaseException) -> bool:
    return not isinstance(exc, MCPError) or exc.error.code == CONNECTION_CLOSED


class _Connection:
    def __init__(self, spec: ServerSpec, loop: asyncio.AbstractEventLoop) -> None:
        self.spec, self.loop = spec, loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.ready: concurrent.futures.Future = concurrent.futures.Future()
        self.dead = False
        self.errlog = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") if spec.transport == "stdio" else None
        self.task = asyncio.run_coroutine_threadsafe(self._serve(), loop)

    def _server(self):
        if self.spec.transport == "http":
            return _guarded_http(self.spec.url)
        params = StdioServerParameters(command=self.spec.argv[0], args=list(self.spec.argv[1:]), env=dict(self.spec.env),
                                       cwd=self.spec.cwd or None)
        return stdio_client(params, errlog=self.errlog)

    async def _serve(self) -> None:
        try:
            async with Client(self._server(), read_timeout_seconds=self.spec.timeout, cache=None) as client:
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
            if not self.ready.done():
                self.ready.set_exception(McpUnavailable(self.describe(exc)))
            if not isinstance(exc, (Exception, asyncio.CancelledError)):
                raise
        finally:
            self.dead = True
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
        if self.errlog is None:
            return ""
        try:
            self.errlog.flush()
            self.errlog.seek(0)
            return self.errlog.read()[-STDERR_TAIL:].strip()
        except (OSError, ValueError):
            return ""

    def wait_ready(self) -> None:
        try:
            self.ready.result(timeout=self.spec.timeout)
        except concurrent.futures.TimeoutError:
            self.close()
            raise McpUnavailable(f"MCP server '{self.spec.name}' did not start within {self.spec.timeout}s") from None

    def submit(self, op: Callable[[Client], Awaitable[Any]]) -> Any:
        if self.dead:
            raise NotSent(f"MCP server '{self.spec.name}' stopped")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (op, fut))
        try:  # the SDK times the call out itself; this is the backstop for a wedged connection
            return fut.result(timeout=self.spec.timeout + 5)
        except concurrent.futures.TimeoutError:
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
