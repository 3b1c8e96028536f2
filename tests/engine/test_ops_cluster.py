"""Checks and notifications under the real django-q2 cluster (separate worker processes): the
on-commit enqueue reaches a worker, which runs the task's checks in the sandbox and delivers alerts."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import close_old_connections
from django.utils import timezone

from tests.conftest import make_space
from tests.harness import isolate_queue, qcluster, wait_for
from tests.ops_helpers import Receiver
from veronica.swarm import ledger
from veronica.ops import notify
from veronica.engine import checks, tick
from veronica.models import NotificationDelivery, Task, TaskCheck

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def own_queue():
    isolate_queue()
    yield
    close_old_connections()


def status(task: Task) -> str:
    close_old_connections()
    return Task.objects.get(pk=task.pk).status


def test_a_worker_process_runs_the_checks_and_settles_the_task(tmp_path):
    space = make_space(tmp_path, workers=("w1",))
    (tmp_path / "alpha" / "ok.txt").write_text("ok\n")
    checks.configure(space, [{"name": "has-ok", "command": "test -f ok.txt", "timeout": 10}], actor="test")
    task = ledger.create_task(space, "boss", "t", verify_policy="checks")  # unassigned: no member run races the test
    ledger.transition(task, "running", actor="boss")
    with qcluster(workers=2):
        ledger.complete(task, actor="w1", result="done")  # commits, then enqueues the django-q2 task
        wait_for(lambda: status(task) == "done", 60, message="checks ran in a worker and the task is done")
    row = TaskCheck.objects.get(task=task)
    assert row.passed and row.exit_code == 0


def test_a_worker_process_delivers_an_alert_and_the_tick_retries_a_failure(tmp_path, settings):
    settings.NOTIFY_ALLOW_HOSTS = ["127.0.0.1"]  # the local receiver is on loopback, refused by default
    receiver = Receiver()
    try:
        receiver.statuses = [500]
        space = make_space(tmp_path, workers=("w1",))
        notify.configure(space, webhook_url=f"{receiver.url}/hook", actor="test")
        task = ledger.create_task(space, "boss", "long")
        ledger.transition(task, "running", actor="boss")
        Task.objects.filter(pk=task.pk).update(started_at=timezone.now() - timedelta(hours=5))
        with qcluster(workers=2, log_path=tmp_path / "q.log", VERONICA_NOTIFY_ALLOW_HOSTS="127.0.0.1"):
            tick.stale_tasks()
            wait_for(lambda: len(receiver.requests) == 1, 60, message="the first attempt reached the receiver")
            wait_for(lambda: NotificationDelivery.objects.filter(attempts=1, last_error__contains="HTTP 500").exists(), 30,
                     message="the failure was recorded")
        NotificationDelivery.objects.update(next_at=timezone.now() - timedelta(seconds=1))
        notify.retry_due()
        assert NotificationDelivery.objects.get().status == "sent" and len(receiver.requests) == 2
    finally:
        receiver.close()
