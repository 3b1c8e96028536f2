"""One command runs it: migrate, seed the demo space and a login, serve web + workers until Ctrl-C."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from veronica.portable.startup import ensure_demo_login, ensure_demo_space

STOP_GRACE = 8.0  # seconds before SIGKILL; Ctrl-C must finish within 10 s
SERVE_TIMEOUT = 60.0  # seconds for daphne to answer its first request (a cold start takes ~5 s)
LOCAL = {"0.0.0.0": "127.0.0.1", "::": "[::1]", "": "127.0.0.1"}  # where to knock when it listens on every address
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # our own port: never through an http_proxy


def knock_host(host: str) -> str:
    host = LOCAL.get(host, host)
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def wait_until_serving(url: str, web, timeout: float) -> bool:
    """True once the web server answers `url` (any HTTP status); False if it exits or the time is up.
    The URL is printed only then: a browser opened on it straight away gets the console, not an error."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if web.poll() is not None:
            return False
        try:
            NO_PROXY.open(url, timeout=2).close()
            return True
        except urllib.error.HTTPError:
            return True  # it answered
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    return False


class Command(BaseCommand):
    help = "Migrate, seed the demo space and login, then serve the web console (daphne) and workers (qcluster)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("VERONICA_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("VERONICA_PORT", "8000")))
        parser.add_argument("--no-demo", action="store_true", help="Do not seed the demo space.")

    def handle(self, *args, host: str, port: int, no_demo: bool, **options):
        call_command("migrate", interactive=False, verbosity=0)  # schedules: the qcluster ensures them itself
        login = None
        if not no_demo:
            login = ensure_demo_login(ensure_demo_space())
        children = self.start(host, port)
        url = f"http://{host}:{port}/"
        self.stdout.write(f"starting web and workers on {url} …")
        self.stdout.flush()
        if not wait_until_serving(f"http://{knock_host(host)}:{port}/login/", children["web"], SERVE_TIMEOUT):
            self.stderr.write(f"the web server did not answer on {url} within {SERVE_TIMEOUT:.0f} s; stopping")
            self.shutdown(children)
            return
        self.stdout.write(self.style.SUCCESS(f"\nVeronica is up: {url}"))
        if login:
            self.stdout.write(f"  login: {login[0]} / {login[1]}   (demo space: {url}spaces/demo/ · admin: {url}admin/)")
        self.stdout.write(f"  data: {settings.DATA_DIR}   database: {settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}")
        self.stdout.write("  Ctrl-C stops web and workers.\n")
        self.stdout.flush()
        stop = {"now": False}

        def on_signal(signum, frame):
            stop["now"] = True

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        while not stop["now"]:
            for name, proc in children.items():
                if proc.poll() is not None:
                    self.stderr.write(f"{name} exited with {proc.returncode}; stopping")
                    stop["now"] = True
            time.sleep(0.2)
        self.shutdown(children)

    def start(self, host: str, port: int) -> dict[str, subprocess.Popen]:
        python = sys.executable
        # Each child gets its own session: a terminal's Ctrl-C reaches only us, and we stop
        # django-q2 through its main PID (signalling its whole group can hang its shutdown).
        web = subprocess.Popen([python, "-m", "daphne", "-b", host, "-p", str(port), "veronica.asgi:application"],
                               start_new_session=True)
        workers = subprocess.Popen([python, "manage.py", "qcluster"], cwd=settings.BASE_DIR, start_new_session=True)
        return {"web": web, "workers": workers}

    def shutdown(self, children: dict[str, subprocess.Popen]) -> None:
        self.stdout.write("stopping web and workers…")
        for proc in children.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        for proc in children.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # safe: runs are leased, nothing is lost
                proc.wait(timeout=2)
        self.stdout.write("stopped.")
