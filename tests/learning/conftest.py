import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from learning import store
from learning.sources import Correction, OutboxItem, SessionItem, StaticSource

WORKER = Path(__file__).with_name("lease_worker.py")


@pytest.fixture(autouse=True)
def _fresh_rule_cache():
    store.clear_cache()
    yield
    store.clear_cache()


@pytest.fixture
def source():
    return StaticSource(
        session_items=[SessionItem("s1", "alice", ["ops"], "operator: never push to main\nWe decided to use PostgreSQL.")],
        outbox=[OutboxItem("o1", ["writing"], "Hello operator!!! I have now finished the long task you gave me today.",
                           "Done: the task is finished.")],
        correction_items=[Correction("c1", ["ops"], "approval denied: do not run rm -rf; reason: it deletes the workspace")],
        routed={"ops", "writing"},
    )


def run_worker(*args, timeout=90):
    """Start lease_worker.py against this test database; returns the Popen."""
    db_name = str(connection.settings_dict["NAME"])
    return subprocess.Popen(
        [sys.executable, str(WORKER), db_name, *map(str, args)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
    )


def worker_result(proc, timeout=120):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode in (0, 3), f"worker failed ({proc.returncode}):\n{err}"
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, f"worker printed no result:\n{out}\n{err}"
    return json.loads(lines[-1])


@pytest.fixture
def worker():
    return run_worker, worker_result
