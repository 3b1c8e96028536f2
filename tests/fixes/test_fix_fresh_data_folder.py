"""`doctor` and `demo` on a fresh data folder migrate first; `doctor` reports the system checks."""
from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from django.core.management import call_command

from tests.conftest import REPO


def _fresh(tmp_path, *command: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "VERONICA_SQLITE_PATH")}
    env["VERONICA_DATA_DIR"] = str(tmp_path / "fresh-data")
    return subprocess.run([sys.executable, "manage.py", *command], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_doctor_on_a_fresh_data_folder_migrates_first(tmp_path):
    done = _fresh(tmp_path, "doctor", "--no-probe")
    assert "no such table" not in done.stderr
    assert "database: sqlite (migrated)" in done.stdout
    # the one problem: no qcluster was started on this data folder
    assert done.returncode == 1 and "1 problem(s)" in done.stderr, done.stderr[-2000:]
    assert "engine ticker: none alive" in done.stdout


def test_demo_on_a_fresh_data_folder_migrates_first(tmp_path):
    done = _fresh(tmp_path, "demo")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Demo finished" in done.stdout


@pytest.mark.django_db
def test_doctor_reports_the_system_check_warnings():
    from learning import api

    from veronica.engine import leases, ticker

    leases.hold_role(ticker.ROLE, "test-host:1:abc", 60)  # a qcluster is running
    api.add_user_rule("nobody-reads-this", "A rule routed to no member.", actor="test")
    out = io.StringIO()
    call_command("doctor", "--no-probe", stdout=out)
    text = out.getvalue()
    assert "! learning.W001: Rule domain" in text and "nobody-reads-this" in text
    assert "warning(s)" in text
