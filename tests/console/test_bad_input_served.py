"""The served app (daphne, its own process) answers the worst bad inputs with a 4xx, not a 500."""
from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import pytest

from veronica.swarm import access
from veronica.models import Member, Message

NUL = "\x00"
CASES = [
    ("POST", "/api/spaces/alpha/messages/", "[" * 100_000, "json"),
    ("POST", "/api/spaces/alpha/messages/", json.dumps({"to": "boss", "body": f"hi{NUL}"}), "body"),
    ("POST", "/api/spaces/alpha/members/", json.dumps({"name": f"w{NUL}9"}), "name"),
    ("POST", "/api/spaces/alpha/members/", json.dumps({"name": "w9", "model": "openai:" + "m" * 200}), "model"),
    ("POST", "/api/spaces/alpha/members/", json.dumps({"name": "operator"}), "name"),
    ("PUT", "/api/spaces/alpha/members/w1/schedule/", json.dumps({"cron": "0 0 30 2 *"}), "schedule"),
    ("PUT", "/api/spaces/alpha/members/w1/schedule/", json.dumps({"cron": "* * * * * *"}), "schedule"),
    ("PUT", "/api/spaces/alpha/blackboard/", json.dumps({"content": f"plan{NUL}"}), "content"),
    ("GET", "/api/spaces/alpha/tasks/?assignee=%00", "", "assignee"),
    ("GET", "/api/spaces/alpha/members/w1%00/", "", "name"),
]


@pytest.mark.parametrize("method, path, body, field", CASES)
def test_the_served_app_refuses_bad_input_with_a_4xx(live_world, live_web, method, path, body, field):
    _, key = access.create_token(live_world.owner, "battery")
    url = urlsplit(live_web.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    conn.request(method, path, body=body.encode(), headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    response = conn.getresponse()
    raw = response.read()
    conn.close()
    assert response.status < 500, f"got {response.status}: a server error"
    assert 400 <= response.status < 500, (response.status, raw[:300])
    assert json.loads(raw)["field"] == field, raw[:300]
    assert not Message.objects.exists() and not Member.objects.filter(name__in=["w9", "operator"]).exists()
    assert Member.objects.get(space=live_world.space, name="w1").schedule == ""


def test_the_served_app_refuses_a_huge_body_before_reading_it(live_world, live_web, settings):
    """Content-Length over VERONICA_MAX_REQUEST_BYTES: 413 at once, though not one body byte was
    sent (so nothing was spooled to disk), and the import page is never reached."""
    url = urlsplit(live_web.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    conn.putrequest("POST", "/spaces/new/")
    conn.putheader("Content-Type", "multipart/form-data; boundary=x")
    conn.putheader("Content-Length", str(settings.MAX_REQUEST_BYTES * 100))
    conn.endheaders()  # and no body at all
    response = conn.getresponse()
    raw = response.read()
    conn.close()
    assert response.status == 413 and json.loads(raw)["field"] == "body"


def test_the_served_app_cuts_a_chunked_body_that_passes_the_limit(live_world, live_web, settings):
    """No Content-Length: daphne stops storing and answers 413 once the bytes pass the limit."""
    url = urlsplit(live_web.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    chunk = b"x" * (1024 * 1024)
    conn.putrequest("POST", "/spaces/new/")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    sent = 0
    try:
        while sent <= settings.MAX_REQUEST_BYTES * 3:  # far more than the limit, if the server let us
            conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server closed: what we want
    response = conn.getresponse()
    raw = response.read()
    conn.close()
    assert response.status == 413 and json.loads(raw)["field"] == "body"
    assert sent <= settings.MAX_REQUEST_BYTES + 8 * len(chunk)  # cut near the limit, not after the whole body
