"""Real server processes for the end-to-end tests: daphne (and later qcluster) against the test DB.

    env = server_env()                    # same DB / data dir / redis as this pytest process
    with ServerProcess.daphne(env) as web:  # web.url == "http://127.0.0.1:<port>"
        ...
    ServerProcess.python(code, env)       # e.g. a producer emitting events from another process
    ServerProcess.qcluster(env)           # the django-q2 cluster, once the engine needs it

Processes are started in their own session and stopped through their main PID (SIGTERM, then
SIGKILL after a grace period), never by name.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from django.db import connection

from tests.harness import wait_until_running
from tests.own_names import own_name

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(**extra: str) -> dict[str, str]:
    """This process's environment, with the subprocess pointed at the current test database."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(HERE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["DJANGO_SETTINGS_MODULE"] = "console_test_settings"
    env["VERONICA_TEST_DB_NAME"] = str(connection.settings_dict["NAME"])
    # a queue of our own: daphne enqueues wakes on it and our qcluster (if any) takes them, never
    # another test run's cluster on the same Redis
    env["VERONICA_Q_NAME"] = own_name("console")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("LOG_LEVEL", "WARNING")
    env.update(extra)
    return env


# The servers' logs, read by the tests after a server stopped (so kept past stop()), in one folder
# of this session's that goes when the session's process ends.
_LOGS = tempfile.TemporaryDirectory(prefix="veronica-console-logs-")


class ServerProcess:
    def __init__(self, cmd: list[str], env: dict[str, str], name: str) -> None:
        self.name = name
        self.log = tempfile.NamedTemporaryFile(prefix=f"console-{name}-", suffix=".log", dir=_LOGS.name, delete=False)
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = ""

    # --- factories --------------------------------------------------------------------------------

    @classmethod
    def daphne(cls, env: dict[str, str], timeout: float = 20) -> ServerProcess:
        port = free_port()
        server = cls([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "veronica.asgi:application"], env, "daphne")
        server.url = f"http://127.0.0.1:{port}"
        server.wait_http("/login/", timeout)
        return server

    @classmethod
    def qcluster(cls, env: dict[str, str], workers: int = 2) -> ServerProcess:
        # INFO: the readiness line is one (the log is a file of its own)
        server = cls([sys.executable, "manage.py", "qcluster"], {**env, "LOG_LEVEL": "INFO", "VERONICA_Q_WORKERS": str(workers)},
                     "qcluster")
        wait_until_running(server.proc, Path(server.log.name))  # not a fixed sleep: as long as forking takes
        return server

    @classmethod
    def python(cls, code: str, env: dict[str, str], *args: str, name: str = "python") -> ServerProcess:
        return cls([sys.executable, "-c", code, *args], env, name)

    # --- lifecycle --------------------------------------------------------------------------------

    def wait_http(self, path: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.output()}")
            try:
                with urllib.request.urlopen(self.url + path, timeout=1) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer {path} within {timeout}s:\n{self.output()}")

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise RuntimeError(f"{self.name} still running after {timeout}s:\n{self.output()}") from None

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-4000:]

    def stop(self, grace: float = 5) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # the main PID only; it stops its own children
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        try:  # its own session: this reaches only its children (q2 workers), safe as runs are leased
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(grace)
        self.log.close()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
