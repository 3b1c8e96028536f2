"""A django-q2 worker readies itself when it is spawned (veronica.engine.warm): the engine's modules are
imported, its connection is open and the claim's UPDATE is compiled before its first wake."""
from __future__ import annotations

import logging

import pytest
from django.db import OperationalError, connection
from django_q.signals import post_spawn

from veronica.swarm import bus
from veronica.engine import slot, warm
from veronica.models import Member, Run

pytestmark = pytest.mark.django_db


def test_the_spawn_signal_compiles_the_claim_and_claims_no_one(space, monkeypatch):
    bus.send(space, "boss", "w1", "work waiting: a claim of w1 would match")
    monkeypatch.setattr(slot, "_claim_sql", {})
    post_spawn.send(sender="django_q", proc_name="Process-1")
    assert slot._claim_sql, "the claim's statement was not compiled"
    assert connection.connection is not None
    assert not Member.objects.exclude(lease_token="").exists()  # nobody was claimed
    assert not Run.objects.exists()


def test_a_failed_warm_up_leaves_the_worker_to_start(monkeypatch, caplog):
    def down(*args, **kwargs):
        raise OperationalError("the database is down")

    monkeypatch.setattr(slot, "claim", down)
    with caplog.at_level(logging.WARNING, logger="veronica.engine.warm"):
        warm.warm_worker(proc_name="Process-1")
    assert "warm-up failed" in caplog.text
