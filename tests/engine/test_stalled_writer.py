"""Embedded mode: a process that holds SQLite's write lock (stalled, stopped) does not crash a
qcluster that starts meanwhile: its start-up retries with back-off and it works once the lock goes."""
from __future__ import annotations

import sqlite3
import time

import pytest
from django.db import close_old_connections, connection

from tests.conftest import make_space
from tests.harness import isolate_queue, qcluster, wait_for, wait_until_running
from veronica.swarm import bus
from veronica.models import Message

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's single writer lock")]


def test_a_qcluster_started_while_another_process_holds_the_write_lock_waits_for_it(tmp_path):
    isolate_queue()
    space = make_space(tmp_path)
    stalled = sqlite3.connect(connection.settings_dict["NAME"], timeout=5, isolation_level=None)
    stalled.execute("BEGIN IMMEDIATE")  # a stopped process holding the writer's lock
    try:
        with qcluster(workers=1, log_path=tmp_path / "cluster.log", wait=False, SQLITE_BUSY_TIMEOUT_MS="200") as proc:
            wait_for(lambda: "retry" in (tmp_path / "cluster.log").read_text(), timeout=60, message="a refused start-up attempt")
            time.sleep(1)
            assert proc.poll() is None, "the qcluster crashed at start-up:\n" + (tmp_path / "cluster.log").read_text()[-2000:]
            stalled.execute("COMMIT")
            wait_until_running(proc, tmp_path / "cluster.log")
            bus.send(space, "operator", "w1", "are you there?")
            wait_for(lambda: close_old_connections() or Message.objects.filter(recipient__name="w1", read_at__isnull=False).exists(),
                     timeout=30, message="the mail read once the lock was released")
    finally:
        stalled.close()
