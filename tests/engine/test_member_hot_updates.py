"""A fence or a heartbeat moves a member's lease end and phase on every step (issue 25 point 1): no
index of the member table may cover those columns, so each such update is HOT (PostgreSQL writes
the new row version beside the old one and no index entry), and the watchdog still finds the leases
that ran out through an index holding only the leased members."""
from __future__ import annotations

import re

import pytest
from django.db import connection
from django.db.models.functions import Now

from veronica.engine import leases, supervisor
from veronica.models import Member

pytestmark = [pytest.mark.django_db,
              pytest.mark.skipif(connection.vendor != "postgresql", reason="HOT updates and index plans are PostgreSQL's")]

# What every fence (veronica.engine.slot) and the run pool's heartbeat write
STEP_COLUMNS = ("lease_expires_at", "phase_since", "phase", "phase_tool")


def hot_updates() -> int:
    with connection.cursor() as cursor:  # this transaction's own counters, current at once
        cursor.execute("SELECT n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = 'veronica_member'")
        return cursor.fetchone()[0]


def test_no_member_index_covers_a_column_a_step_writes():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = 'veronica_member'::regclass")
        defs = [row[0] for row in cursor.fetchall()]
    for column in STEP_COLUMNS:
        assert not [d for d in defs if re.search(rf"\b{column}\b", d)], f"an index covers {column}: its updates are not HOT"


def test_a_steps_lease_renewal_is_a_hot_update(space):
    w1 = supervisor.get_member(space, "w1")
    Member.objects.filter(pk=w1.pk).update(run_status="busy", lease_token="t", lease_expires_at=leases.db_now_plus(60))
    before = hot_updates()
    for phase in ("thinking", "executing", "thinking"):
        Member.objects.filter(pk=w1.pk, lease_token="t").update(lease_expires_at=leases.db_now_plus(60), phase_since=Now(),
                                                                 phase=phase, phase_tool="list_dir")
    assert hot_updates() - before == 3


def test_the_watchdog_reads_the_leased_members_through_their_index(space):
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE veronica_member")
    run_out = Member.objects.filter(lease_expires_at__lt=Now()).exclude(lease_token="")
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a few rows: the plan a big table gets
        plan = run_out.explain()
    assert "member_leased_idx" in plan, plan


def test_the_member_tables_pages_keep_room_for_a_rows_next_version():
    """Filled to 100 %, 42 % of the fleet's member updates found no room on the row's page and were not
    HOT after all (bench/fleet_profile.py); migration 0032 fills them to 70 %."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = 'veronica_member'")
        (options,) = cursor.fetchone()
    assert options and "fillfactor=70" in options, options
