"""Server-sent events read straight off an HTTP response, for the streamed vendor calls.

The SDKs' own stream objects decode each event into a str, then into a model object per chunk, and
close the response at `[DONE]` without reading the body's end, which throws its connection away:
every streamed call opened a new one. Here an event's data stays bytes until `json.loads` (which
takes bytes), and `drain` reads the rest of the body so the connection goes back to the pool.

Line rules as in the HTML standard's event-stream interpretation: a line ends in LF, CRLF or CR; a
blank line dispatches the event; a line starting with ':' is a comment; `field: value` loses one
leading space; `data` lines are joined with LF; an event with neither data nor a name is dropped, and
so is one the body ends inside. `id` and `retry` are not read (no vendor call of ours resumes a stream).
"""
from __future__ import annotations

from typing import Iterable, Iterator

# After the last event the body has at most its chunked terminator left: it comes with the last event
# or right behind it. A server that keeps the body open after [DONE] costs this long, then the
# connection is closed, as before.
DRAIN_SECONDS = 0.1


def events(chunks: Iterable[bytes]) -> Iterator[tuple[bytes, bytes]]:
    """(event name, data) of every event in a body given as byte chunks split anywhere."""
    pending = b""
    name, data = b"", []
    for chunk in chunks:
        pending += chunk
        if b"\r" in pending:
            held = pending.endswith(b"\r")  # its LF may be the next chunk's first byte
            pending = pending[:-1] if held else pending
            pending = pending.replace(b"\r\n", b"\n").replace(b"\r", b"\n") + (b"\r" if held else b"")
        lines = pending.split(b"\n")
        pending = lines.pop()
        for line in lines:
            if not line:
                if data or name:
                    yield name, b"\n".join(data)
                name, data = b"", []
                continue
            field, _, value = line.partition(b":")
            if not field:
                continue  # a comment (a keep-alive)
            if value[:1] == b" ":
                value = value[1:]
            if field == b"data":
                data.append(value)
            elif field == b"event":
                name = value
    # a last event without its blank line is dropped, as the standard (and the SDKs' decoders) have it
