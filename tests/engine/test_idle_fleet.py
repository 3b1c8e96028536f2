"""Ten thousand idle members cost nothing (issue 25.3), at test size: an idle tick's statements do not
grow with members, scheduled or not, and `register` costs the same per member and per space however
many spaces there are already. bench/fleet_scale.py measures the same at 1,000 spaces x 10 members."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from bench.fleet_scale import write_manifest  # the bench's manifest: the two measure the same spaces
from veronica.engine import retention, tick
from veronica.portable.manifest import register_space
from veronica.models import Member, Wake


pytestmark = pytest.mark.django_db


def register_fleet(tmp_path: Path, prefix: str, spaces: int, members: int) -> list[int]:
    """Register `spaces` spaces of `members` members (half scheduled); the statements each took."""
    manifest = write_manifest(tmp_path / f"{prefix}-manifest", prefix, members)
    costs = []
    for s in range(spaces):
        workdir = tmp_path / f"{prefix}-ws{s}"
        workdir.mkdir()
        with CaptureQueriesContext(connection) as queries:
            register_space(manifest, slug=f"{prefix}{s}", name=f"{prefix} {s}", workdir=workdir)
        costs.append(len(queries))
    return costs


def idle_tick(monkeypatch) -> int:
    woken = []
    monkeypatch.setattr(tick, "enqueue_wake", lambda pk, source: woken.append(pk))
    monkeypatch.setattr(retention, "_last_purge", time.monotonic())  # the daily purge is not this tick's
    with CaptureQueriesContext(connection) as queries:
        summary = tick.tick()
    assert not any(summary.values()) and woken == [], summary
    return len(queries)


def test_an_idle_tick_costs_the_same_with_10_or_200_members_half_of_them_scheduled(tmp_path, monkeypatch):
    register_fleet(tmp_path, "a", spaces=1, members=10)
    assert Member.objects.exclude(schedule="").count() == 5
    small = idle_tick(monkeypatch)
    register_fleet(tmp_path, "b", spaces=19, members=10)
    assert Member.objects.count() == 200 and Member.objects.exclude(schedule="").count() == 100
    assert idle_tick(monkeypatch) == small, "an idle tick must not cost anything per member or schedule"
    assert not Wake.objects.exists()


def test_register_costs_the_same_per_member_and_per_space_however_many_spaces_exist(tmp_path):
    one = register_fleet(tmp_path, "p", spaces=1, members=4)[0]
    two = register_fleet(tmp_path, "q", spaces=1, members=8)[0]
    four = register_fleet(tmp_path, "r", spaces=1, members=16)[0]
    assert four - two == 2 * (two - one), f"statements per member must be constant: {one}, {two}, {four} for 4, 8, 16"
    costs = register_fleet(tmp_path, "s", spaces=12, members=4)
    assert costs[-1] == costs[0] == one, f"the 12th space cost {costs[-1]} statements, the first {costs[0]}"
