"""Queueing a task's verify checks: the on-commit enqueue the ledger calls when a task enters verifying, and
the django-q2 enqueue the tick's recovery uses too. Split out of veronica.engine.checks so the ledger can call
it without importing the checks runner (which calls the ledger)."""
from __future__ import annotations

import logging

from django.db import transaction

from veronica.models import Task, VerifyPolicy

log = logging.getLogger("veronica.engine.checks")  # the checks' logger, as before the split


def enqueue(task_id: int) -> None:
    from django_q.tasks import async_task

    try:
        async_task("veronica.engine.checks.run_checks", task_id, q_options={"task_name": f"checks-{task_id}"})
    except Exception:  # the tick's recovery finds the unclaimed verifying task
        log.warning("could not enqueue checks for task %s; the tick recovers it", task_id, exc_info=True)


def enqueue_on_commit(task: Task) -> None:
    """Called by the ledger when a task enters verifying."""
    if task.verify_policy == VerifyPolicy.CHECKS:
        task_id = task.pk
        transaction.on_commit(lambda: enqueue(task_id))
