"""Request bodies over VERONICA_MAX_REQUEST_BYTES are refused before Django reads them: with a
Content-Length, without reading anything; chunked, after no more than the limit."""
import asyncio
import json

import pytest

from veronica.web.body_limit import BodyLimit

LIMIT = 1000


class App:
    """Stands for Django's handler: reads the body to the end, then answers 200."""

    def __init__(self):
        self.called = False

    async def __call__(self, scope, receive, send):
        self.called = True
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # what Django does on RequestAborted: no response
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def serve(chunks, content_length=None):
    app, sent, handed = App(), [], []
    queue = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive():
        message = queue.pop(0)
        handed.append(len(message["body"]))
        return message

    async def send(message):
        sent.append(message)

    headers = [(b"content-length", str(content_length).encode())] if content_length is not None else []
    asyncio.run(BodyLimit(app, LIMIT)({"type": "http", "method": "POST", "path": "/x/", "headers": headers}, receive, send))
    return app, sent, sum(handed)


def test_a_declared_size_over_the_limit_is_refused_unread():
    app, sent, read = serve([b"x" * 10], content_length=10 ** 9)
    assert not app.called and read == 0
    assert sent[0]["status"] == 413
    body = json.loads(sent[1]["body"])
    assert body["field"] == "body" and body["max_bytes"] == LIMIT and "1000000000 bytes" in body["error"]


def test_a_chunked_body_is_cut_when_it_passes_the_limit():
    app, sent, read = serve([b"x" * 400] * 50)  # 20,000 bytes, no Content-Length
    assert read <= LIMIT + 400  # never more than one chunk past the limit
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [413]


@pytest.mark.parametrize("chunks, length", [([b"x" * LIMIT], LIMIT), ([b"a" * 300, b"b" * 300], None), ([b""], None)])
def test_bodies_within_the_limit_reach_the_app(chunks, length):
    app, sent, _ = serve(chunks, content_length=length)
    assert app.called and sent[0]["status"] == 200


def test_the_served_application_refuses_a_huge_upload(client, settings):
    """Wired in front of Django in veronica.asgi (and only HTTP: sockets are untouched)."""
    from veronica import asgi

    http = asgi.application.application_mapping["http"].app  # inside the collector's settle-once wrapper
    assert isinstance(http, BodyLimit) and http.limit == settings.MAX_REQUEST_BYTES
    assert settings.MAX_REQUEST_BYTES >= 5 * 1024 * 1024 + 65536  # an archive upload fits
