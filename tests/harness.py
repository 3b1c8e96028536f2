"""Real processes for engine and browser tests: a django-q2 cluster (and a daphne server) pointed
at the test database. Stopped through the main PID, SIGKILL as the fallback (always safe)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

from django.db import connection

from tests.own_names import own_name

REPO = Path(__file__).resolve().parent.parent


def worker_env(**extra: str) -> dict[str, str]:
    """The environment a child process needs to use this test run's database and queue."""
    from django_q.conf import Conf

    env = os.environ.copy()
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        env["VERONICA_SQLITE_PATH"] = str(db["NAME"])
    else:
        user = quote(db.get("USER") or "postgres", safe="")
        password = f":{quote(db['PASSWORD'], safe='')}" if db.get("PASSWORD") else ""
        env["DATABASE_URL"] = f"postgres://{user}{password}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"
    env["VERONICA_Q_NAME"] = Conf.CLUSTER_NAME
    env.update(extra)
    return env


def isolate_queue() -> str:
    """A queue name of our own, so concurrent test runs on one Redis never take each other's wakes."""
    from django_q.conf import Conf

    name = own_name("q")
    Conf.PREFIX = Conf.CLUSTER_NAME = name
    return name


def _stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=5)
    settle_backends()


def settle_backends(timeout: float = 10.0) -> None:
    """Wait until no other backend runs a statement on the test database. A statement a killed
    process sent runs on in its server backend until it ends; the test's flush (TRUNCATE) must not
    start meanwhile, or the two deadlock and the next test finds the last one's rows."""
    if connection.vendor != "postgresql":
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND pid <> pg_backend_pid() AND state = 'active' AND backend_type = 'client backend'")
            if not cursor.fetchone()[0]:
                return
        time.sleep(0.05)


RUNNING = b"] running."  # django-q2's "Q Cluster <name> [<queue>] running.", logged once its workers are forked


def wait_until_running(proc: subprocess.Popen, log_path: Path, timeout: float = 60) -> None:
    """Until the cluster says it runs (or exits): no fixed sleep, so an idle host does not wait the
    time a loaded one needs, and a loaded one is not cut short. Wakes enqueued before that simply
    wait in the broker."""
    wait_for(lambda: proc.poll() is not None or RUNNING in log_path.read_bytes(), timeout, interval=0.05,
             message="the cluster to start its workers")


@contextmanager
def qcluster(workers: int = 4, log_path: Path | None = None, *, wait: bool = True, **env: str):
    """wait=False yields at once: for a test whose cluster cannot be ready yet (its database refuses)."""
    own_log = log_path is None
    if own_log:
        handle, name = tempfile.mkstemp(prefix="qcluster-", suffix=".log")
        os.close(handle)
        log_path = Path(name)
    log = open(log_path, "ab")
    env.setdefault("LOG_LEVEL", "INFO")  # the readiness line is an INFO line (over the environment's level)
    proc = subprocess.Popen([sys.executable, "manage.py", "qcluster"], cwd=REPO, start_new_session=True,
                            env=worker_env(VERONICA_Q_WORKERS=str(workers), **env), stdout=log, stderr=subprocess.STDOUT)
    try:
        if wait:
            wait_until_running(proc, log_path)
        yield proc
    finally:
        _stop(proc)
        log.close()
        if own_log:
            log_path.unlink(missing_ok=True)


def kill_cluster(proc: subprocess.Popen) -> None:
    """A crash: SIGKILL the whole cluster, workers mid-run included."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=5)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def daphne(port: int | None = None, **env: str):
    port = port or free_port()
    proc = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "veronica.asgi:application"],
                            cwd=REPO, start_new_session=True, env=worker_env(**env), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(proc)


def wait_for(predicate, timeout: float, interval: float = 0.2, message: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")


@contextmanager
def round_trips():
    """The statements sent meanwhile, one entry per round trip: statements psycopg sends as one pipeline
    (waggle's savepoint on a server-binding connection) are joined into one entry, as the single
    simple-protocol query of client-side binding would be."""
    sent: list[str] = []
    last_pipe: list = [None]

    def record(execute, sql, params, many, context):
        pipe = getattr(connection.connection, "_pipeline", None)  # psycopg's open pipeline, if any
        if pipe is not None and pipe is last_pipe[0] and sent:
            sent[-1] += f"; {sql}"
        else:
            sent.append(sql)
        last_pipe[0] = pipe
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        yield sent
