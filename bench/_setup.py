"""Set-up the bench scripts share: Django in a child process, a throwaway database and Redis
namespace per run (unique names, dropped afterwards), percentiles, and a qcluster process group.
BENCH_PG_URL points the hosted runs at another PostgreSQL (a private cluster with pg_stat_statements, to
see where its CPU goes); BENCH_KEEP_DB=1 keeps the run's database (and Redis keys) for inspection."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PG = os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432")  # a private cluster's, to profile its statements
REDIS = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/4")


def django_setup() -> None:
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "veronica.settings")
    import django

    django.setup()


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def psql(sql: str) -> None:
    subprocess.run(["psql", "-d", f"{PG}/postgres", "-qc", sql], check=True,
                   capture_output=True)


def drop_redis_prefix(url: str, prefixes: list[str]) -> None:
    try:
        import redis

        client = redis.Redis.from_url(url)
        for prefix in prefixes:
            for key in client.scan_iter(match=f"*{prefix}*", count=500):
                client.delete(key)
    except Exception as exc:  # a leftover key is noise, never a failed bench
        print(f"warning: could not clean Redis keys {prefixes}: {exc}", file=sys.stderr)


@contextmanager
def isolated_env(mode: str, tag: str):
    """The environment of one mode's run: its own SQLite dir, or its own PostgreSQL database and a
    unique Redis prefix / queue name. Everything it created is dropped on the way out."""
    unique = f"{tag}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    data_dir = tempfile.mkdtemp(prefix=f"bench-{tag}-{mode}-")
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "VERONICA_SQLITE_PATH")}
    env.update(DJANGO_SETTINGS_MODULE="veronica.settings", VERONICA_DATA_DIR=data_dir, LOG_LEVEL="WARNING",
               PYTHONUNBUFFERED="1", VERONICA_Q_NAME=f"q-{unique}", VERONICA_CHANNEL_PREFIX=f"ch-{unique}")
    if mode == "hosted":
        psql(f"DROP DATABASE IF EXISTS {unique} WITH (FORCE)")
        psql(f"CREATE DATABASE {unique}")
        env.update(DATABASE_URL=f"{PG}/{unique}", REDIS_URL=REDIS)
    try:
        yield env
    finally:
        if mode == "hosted" and not os.environ.get("BENCH_KEEP_DB"):
            psql(f"DROP DATABASE IF EXISTS {unique} WITH (FORCE)")
            drop_redis_prefix(REDIS, [f"q-{unique}", f"ch-{unique}"])
        shutil.rmtree(data_dir, ignore_errors=True)


class QCluster:
    """One `manage.py qcluster` in its own session, standing for one worker host: stop() lets it finish
    (SIGTERM, then SIGKILL to the whole group after `grace` seconds), kill() is a host dying at once."""

    def __init__(self, env: dict, log: Path, *, wait_running: bool = False, grace: float = 20) -> None:
        self.log, self.grace = log, grace
        handle = open(log, "ab")
        self.proc = subprocess.Popen([sys.executable, "manage.py", "qcluster"], cwd=REPO, start_new_session=True, env=env,
                                     stdout=handle, stderr=subprocess.STDOUT)
        handle.close()
        if wait_running:  # until django-q2 logs its cluster up, or two minutes
            deadline = time.monotonic() + 120
            while b"] running." not in log.read_bytes():
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the cluster did not start:\n{log.read_text()[-3000:]}")
                time.sleep(0.1)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=self.grace)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
