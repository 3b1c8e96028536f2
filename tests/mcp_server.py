"""A real MCP server written with the official SDK, for the suite: `python tests/mcp_server.py`
serves stdio; `--http PORT` serves streamable HTTP on 127.0.0.1:PORT/mcp."""
from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

server = MCPServer("veronica-test")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def whoami() -> str:
    """This server's process id and the GREETING variable it was started with."""
    return f"pid={os.getpid()} greeting={os.environ.get('GREETING', '')}"


@server.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
def double(a: int) -> str:
    """Double an integer (declared closed-world: it reaches nothing outside)."""
    return str(2 * a)


@server.tool()
def note(text: str) -> str:
    """Pretend to store a note (not read-only: goes through the permission gate)."""
    return f"noted: {text}"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def fail() -> str:
    """Always fails."""
    raise ToolError("this tool always fails")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def crash() -> str:
    """Kill the server process mid-call."""
    os._exit(3)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def nap(seconds: float) -> str:
    """Sleep, then answer (a call still in flight when the run is stopped)."""
    time.sleep(seconds)
    return f"slept {seconds}"


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
