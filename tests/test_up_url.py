"""`bin/run` (manage.py up) prints the URL once the web server answers, not before (issue 22.9)."""
from __future__ import annotations

import io
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from django.core.management import call_command

from veronica.management.commands import up


class Quiet(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(302)
        self.send_header("Location", "/")
        self.end_headers()

    def log_message(self, *args):
        pass


class FakeProc:
    returncode = 0

    def __init__(self):
        self.exited = False

    def poll(self):
        return 0 if self.exited else None

    def send_signal(self, sig):
        self.exited = True

    def wait(self, timeout=None):
        return 0


def test_the_url_is_printed_only_once_the_server_answers(db, monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    port = server.server_address[1]
    answering = threading.Event()
    web, workers = FakeProc(), FakeProc()
    seen = {}

    class Out(io.StringIO):
        def write(self, text):
            if "Veronica is up" in text:
                seen["answering"] = answering.is_set()
                web.exited = True  # end the command's loop
            return super().write(text)

    def start(self, host, port_):
        def serve_later():  # the server answers only after the command began knocking
            knocked.wait(10)
            answering.set()
            server.serve_forever(poll_interval=0.05)
        threading.Thread(target=serve_later, daemon=True).start()
        return {"web": web, "workers": workers}

    knocked = threading.Event()
    real_open = up.NO_PROXY.open

    def knock(url, timeout=None):
        knocked.set()
        if not answering.is_set():
            raise OSError("connection refused")
        return real_open(url, timeout=timeout)

    monkeypatch.setattr(up.signal, "signal", lambda *args: None)  # the test process keeps its own handlers
    monkeypatch.setattr(up.Command, "start", start)
    monkeypatch.setattr(up.NO_PROXY, "open", knock)
    out = Out()
    try:
        call_command("up", host="127.0.0.1", port=port, no_demo=True, stdout=out)
    finally:
        server.shutdown()
        server.server_close()
    text = out.getvalue()
    assert seen == {"answering": True}
    assert text.index("starting web and workers") < text.index(f"Veronica is up: http://127.0.0.1:{port}/")


def test_a_web_server_that_exits_is_reported_and_no_url_is_printed(db, monkeypatch):
    web, workers = FakeProc(), FakeProc()
    web.exited = True
    monkeypatch.setattr(up.signal, "signal", lambda *args: None)
    monkeypatch.setattr(up.Command, "start", lambda self, host, port: {"web": web, "workers": workers})
    out, err = io.StringIO(), io.StringIO()
    call_command("up", host="127.0.0.1", port=9, no_demo=True, stdout=out, stderr=err)
    assert "Veronica is up" not in out.getvalue() and "did not answer" in err.getvalue()
