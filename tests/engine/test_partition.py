"""A worker host cut off from the database mid-transaction (hosted mode, a real partition: the
cluster runs in its own network namespace whose loopback we take down) must not freeze its space
for everyone else, must log its retries, and must still stop on SIGTERM within the grace period."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import close_old_connections, connection

from tests.conftest import make_space
from tests.harness import REPO, isolate_queue, wait_for, worker_env
from tests.netns import plan, unix_to_tcp
from veronica import bus
from veronica.models import Message

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]
IDLE_TX, GRACE = 2, 3
CUT_OFF = dict(VERONICA_DB_IDLE_IN_TRANSACTION_TIMEOUT=str(IDLE_TX), VERONICA_DB_TCP_USER_TIMEOUT="2", VERONICA_DB_CONNECT_TIMEOUT="2",
               VERONICA_DB_KEEPALIVES_IDLE="1", VERONICA_DB_KEEPALIVES_INTERVAL="1", VERONICA_DB_KEEPALIVES_COUNT="2",
               VERONICA_ENGINE_TICK_SECONDS="1", VERONICA_Q_STOP_GRACE=str(GRACE), VERONICA_Q_WORKERS="2")


def can_partition() -> str:
    if connection.vendor != "postgresql":
        return "a network partition needs the hosted database"
    if (connection.settings_dict.get("HOST") or "").startswith("/"):
        return "the database is reached by a Unix socket: no network to cut"
    if not (shutil.which("unshare") and shutil.which("nsenter") and shutil.which("ip")):
        return "needs unshare, nsenter and ip (util-linux, iproute2)"
    if subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode != 0:
        return "cannot create a network namespace here (needs CAP_SYS_ADMIN)"
    return ""


def alive(pid: int) -> bool:
    # The process can be reaped between any two reads of /proc; gone then is simply not alive.
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:  # FileNotFoundError, or ProcessLookupError mid-read
        return False


@pytest.fixture
def isolated_host(tmp_path):
    """Start a qcluster in a network namespace; yield (qcluster pid, cut(), log path)."""
    reason = can_partition()
    if reason:
        pytest.skip(reason)
    isolate_queue()
    env = worker_env(**CUT_OFF)
    route = plan(env["DATABASE_URL"], settings.REDIS_URL)  # the URLs this run was given, whatever their ports
    env.update(DATABASE_URL=route.database_url, REDIS_URL=route.redis_url)
    relays = [unix_to_tcp(tmp_path / "pg.sock", *route.pg), unix_to_tcp(tmp_path / "redis.sock", *route.redis)]
    log_path, pidfile = tmp_path / "cluster.log", tmp_path / "qcluster.pid"
    log = open(log_path, "ab")
    launcher = subprocess.Popen(
        ["unshare", "-n", sys.executable, str(REPO / "tests" / "netns.py"), "--pidfile", str(pidfile),
         "--pg-sock", str(tmp_path / "pg.sock"), "--pg-port", str(route.pg[1]), "--redis-sock", str(tmp_path / "redis.sock"),
         "--redis-port", str(route.redis[1]), "--", "manage.py", "qcluster"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    qcluster_pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text(), 10, message="the isolated qcluster"))
    wait_for(lambda: b"is the active ticker" in log_path.read_bytes(), 20, message="the isolated cluster's ticker")

    def cut() -> None:
        subprocess.run(["nsenter", "-t", str(launcher.pid), "-n", "ip", "link", "set", "lo", "down"], check=True)

    try:
        yield qcluster_pid, cut, log_path
    finally:
        try:
            os.killpg(launcher.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        launcher.wait(timeout=5)
        for relay in relays:
            relay.close()  # the database now sees the sessions end
        log.close()
        close_old_connections()


def test_a_worker_cut_off_mid_transaction_frees_its_space_logs_retries_and_stops_on_sigterm(tmp_path, isolated_host):
    from django_q.tasks import async_task

    qcluster_pid, cut, log_path = isolated_host
    space = make_space(tmp_path, workers=("w1",))
    marker = tmp_path / "locked"
    async_task("tests.engine.probes.hold_space_lock", space.pk, str(marker))
    wait_for(marker.exists, 20, message="the worker inside its transaction, holding the space row")
    cut()

    sent: dict = {}

    def send_to_the_same_space() -> None:
        started = time.monotonic()
        bus.send(space, "boss", "w1", "still getting through")
        sent["after"] = time.monotonic() - started
        connection.close()

    other_host = threading.Thread(target=send_to_the_same_space, daemon=True)
    other_host.start()
    other_host.join(IDLE_TX + 8)
    assert "after" in sent, "a send to the space blocked behind the partitioned worker's lock"
    assert sent["after"] <= IDLE_TX + 4, f"the send waited {sent['after']:.1f}s for a dead session's lock"
    assert Message.objects.filter(space=space, body="still getting through").exists()

    retries = lambda: log_path.read_text().count("beat failed")  # noqa: E731
    wait_for(lambda: retries() >= 2, 20, message="the partitioned ticker logging its retries")

    os.kill(qcluster_pid, signal.SIGTERM)
    signalled = time.monotonic()
    wait_for(lambda: not alive(qcluster_pid), GRACE + 5, interval=0.1, message="the cut-off qcluster to stop on SIGTERM")
    assert time.monotonic() - signalled <= GRACE + 3
