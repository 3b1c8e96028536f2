"""A hard cap on request bodies, before anything spools them.

Two layers each spool a whole body before any view's limit runs: daphne (Twisted buffers the body
in a temporary file before it calls the application) and Django's ASGI handler (it reads the body
to the end before building the request). So a view's own cap only ever stopped the third copy.

* `limit_daphne` teaches daphne's request to answer 413 and close as soon as Content-Length is
  over VERONICA_MAX_REQUEST_BYTES, or, without one (chunked), as soon as the bytes received pass it.
  This reaches into daphne's Twisted request (its documented `gotLength`/`handleContentChunk`
  callbacks, from twisted.web.http.Request); tests/console/test_bad_input_served.py pins it
  against the real daphne, so an upgrade that changes them fails there.
* `BodyLimit` does the same at the ASGI level for any other server (uvicorn, hypercorn).

Views keep their own, smaller limits (the JSON parser, the webhook, the archive upload); this
one bounds the disk.
"""
from __future__ import annotations

import json


class _Discard:
    """Where a refused request's body goes: nowhere."""

    closed = False

    def write(self, data: bytes) -> None:
        pass

    def seek(self, *args) -> None:
        pass

    def read(self, *args) -> bytes:
        return b""

    def close(self) -> None:
        pass


def limit_daphne(limit: int) -> None:
    """Idempotent; the limit is read per request, so a later call changes it."""
    try:
        from daphne.http_protocol import WebRequest
    except ImportError:  # not served by daphne
        return
    WebRequest.veronica_body_limit = limit
    if getattr(WebRequest, "_veronica_body_limit_installed", False):
        return
    got_length, content_chunk, process = WebRequest.gotLength, WebRequest.handleContentChunk, WebRequest.process

    def refuse(request, declared: int | None) -> None:
        request.veronica_refused = True
        request.content = _Discard()
        body = _too_large(declared, request.veronica_body_limit)
        transport = request.channel.transport
        transport.write(b"HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\n"
                        b"Cache-Control: private, no-store\r\nConnection: close\r\n"
                        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        transport.loseConnection()

    def gotLength(self, length):
        self.veronica_seen, self.veronica_refused = 0, False
        if length is not None and length > self.veronica_body_limit:
            return refuse(self, length)  # before a single body byte is stored
        return got_length(self, length)

    def handleContentChunk(self, data):
        if getattr(self, "veronica_refused", False):
            return None
        self.veronica_seen = getattr(self, "veronica_seen", 0) + len(data)
        if self.veronica_seen > self.veronica_body_limit:
            return refuse(self, None)
        return content_chunk(self, data)

    def guarded_process(self):
        if getattr(self, "veronica_refused", False):
            return None  # answered already; the application never sees it
        return process(self)

    WebRequest.gotLength, WebRequest.handleContentChunk, WebRequest.process = gotLength, handleContentChunk, guarded_process
    WebRequest._veronica_body_limit_installed = True


def _too_large(declared: int | None, limit: int) -> bytes:
    size = f"{declared} bytes" if declared is not None else f"over {limit} bytes"
    return json.dumps({"error": f"the request body is {size}; the limit is {limit} bytes (VERONICA_MAX_REQUEST_BYTES)",
                       "field": "body", "max_bytes": limit}).encode()


async def _answer_413(send, declared: int | None, limit: int) -> None:
    body = _too_large(declared, limit)
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), (b"cache-control", b"private, no-store")]})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = next((value for name, value in scope.get("headers", ()) if name == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await _answer_413(send, int(declared), self.limit)  # the body is never read
        seen = 0
        cut = started = False

        async def counted_receive():
            nonlocal seen, cut
            if cut:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    cut = True  # read no further; Django sees a client that went away
                    return {"type": "http.disconnect"}
            return message

        async def watched_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, counted_receive, watched_send)
        if cut and not started:
            await _answer_413(send, None, self.limit)
