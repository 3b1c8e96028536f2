"""django-q2 task functions (scheduled by learning.schedules.ensure_schedules)."""
from __future__ import annotations

from django.conf import settings

from .passes import run_distill, run_learn, run_reflect


def _summary(run) -> dict:
    return {"run": run.pk, "kind": run.kind, "status": run.status, "stats": run.stats, "errors": run.errors[:5]}


def reflect() -> dict:
    return _summary(run_reflect())


def learn() -> dict:
    # LEARNING_AUTO_APPROVE: False (default, proposals wait for review), True, or a dotted path to
    # a callable(domain) -> bool the host uses to apply its spaces' "required rule review" setting.
    return _summary(run_learn(auto_approve=getattr(settings, "LEARNING_AUTO_APPROVE", False)))


def distill() -> dict:
    return _summary(run_distill())
