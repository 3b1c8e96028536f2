"""/metrics in the Prometheus text format, computed from the rows (the DB is the source of truth).

Every series is labelled by space slug and limited to the spaces passed in (the requester's). Each
family is one grouped query, so the cost does not grow with the number of rows returned.
"""
from __future__ import annotations

import time
from collections import defaultdict
from datetime import timedelta

from django.db.models import QuerySet, Sum

from veronica.engine import checks
from veronica.ops import metrics_members  # the per-member families (they build on metrics_family, not on this module)
from veronica.ops.metrics_family import Family, _counts, _histogram, add_histogram, run_durations
from veronica.models import (
    AlertTally, Approval, ApprovalStatus, Member, Message, NotificationDelivery, Run, RunOutcome, Space, Task, UsageDay, Wake,
)

DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800)
TOKEN_BUCKETS = (100, 1000, 5000, 10000, 50000, 100000, 500000)
ABORT_OUTCOMES = (RunOutcome.ABORTED, RunOutcome.ERROR, RunOutcome.BUDGET, RunOutcome.LEASE_EXPIRED)


def render(spaces: QuerySet[Space]) -> str:
    slugs = dict(spaces.values_list("pk", "slug"))
    ids = list(slugs)
    families = [
        _wakes(ids, slugs), _runs(ids, slugs), _aborts(ids, slugs), _run_duration(ids, slugs), _run_tokens(ids, slugs),
        _tokens(ids, slugs), _usd(ids, slugs), _events(spaces), _messages(ids, slugs), _unread(ids, slugs),
        _tasks(ids, slugs), _members(ids, slugs), _approvals(ids, slugs), _checks(ids, slugs), _deliveries(ids, slugs),
        _alerts(ids, slugs), *_process(),
    ]
    families += metrics_members.families(ids, slugs)  # iss11-fix: per-member labels and engine counts
    return "\n".join(f.render() for f in families) + "\n"


def _wakes(ids: list[int], slugs: dict[int, str]) -> Family:
    fam = Family("veronica_wakes_total", "counter", "Wakes received by workers, by source and whether they claimed the run slot.")
    for row in _counts(Wake.objects.filter(member__space_id__in=ids), "member__space_id", "source", "claimed"):
        fam.add(row["n"], space=slugs[row["member__space_id"]], source=row["source"], claimed=str(row["claimed"]).lower())
    return fam


def _runs(ids: list[int], slugs: dict[int, str]) -> Family:
    return _outcomes(Family("veronica_runs_total", "counter", "Runs by outcome (running = in flight)."),
                     Run.objects.filter(member__space_id__in=ids), slugs)


def _aborts(ids: list[int], slugs: dict[int, str]) -> Family:
    return _outcomes(Family("veronica_run_aborts_total", "counter", "Runs that did not finish normally, by outcome."),
                     Run.objects.filter(member__space_id__in=ids, outcome__in=ABORT_OUTCOMES), slugs)


def _outcomes(fam: Family, runs: QuerySet, slugs: dict[int, str]) -> Family:
    """Runs counted by space and outcome: one grouped query."""
    for row in _counts(runs, "member__space_id", "outcome"):
        fam.add(row["n"], space=slugs[row["member__space_id"]], outcome=row["outcome"])
    return fam


def _run_duration(ids: list[int], slugs: dict[int, str]) -> Family:
    fam = Family("veronica_run_duration_seconds", "histogram", "Wall time of finished runs.")
    for row in _histogram(run_durations(ids), "duration", DURATION_BUCKETS, lambda b: timedelta(seconds=b)):
        total = row["total_sum"] or timedelta(0)
        add_histogram(fam, row, DURATION_BUCKETS, round(total.total_seconds(), 3), space=slugs[row["member__space_id"]])
    return fam


def _run_tokens(ids: list[int], slugs: dict[int, str]) -> Family:
    fam = Family("veronica_run_tokens", "histogram", "Tokens used per finished run.")
    qs = Run.objects.filter(member__space_id__in=ids, ended_at__isnull=False)
    for row in _histogram(qs, "tokens", TOKEN_BUCKETS, lambda b: b):
        add_histogram(fam, row, TOKEN_BUCKETS, row["total_sum"] or 0, space=slugs[row["member__space_id"]])
    return fam


def _tokens(ids: list[int], slugs: dict[int, str]) -> Family:
    fam = Family("veronica_tokens_total", "counter", "Model tokens metered, by class.")
    rows = UsageDay.objects.filter(space_id__in=ids).values("space_id").annotate(
        input=Sum("input_tokens"), output=Sum("output_tokens"), cache_read=Sum("cache_read_tokens"),
        cache_write=Sum("cache_write_tokens")).order_by("space_id")
    for row in rows:
        for cls in ("input", "output", "cache_read", "cache_write"):
            fam.add(row[cls] or 0, space=slugs[row["space_id"]], **{"class": cls})
    return fam


def _usd(ids: list[int], slugs: dict[int, str]) -> Family:
    fam = Family("veronica_usd_total", "counter", "Estimated model spend in USD.")
    for row in UsageDay.objects.filter(space_id__in=ids).values("space_id").annotate(usd=Sum("usd")).order_by("space_id"):
        fam.add(float(row["usd"] or 0), space=slugs[row["space_id"]])
    return fam


def _events(spaces: QuerySet[Space]) -> Family:
    fam = Family("veronica_events_total", "counter", "Events written (the space's event sequence).")
    for slug, seq in spaces.order_by("slug").values_list("slug", "event_seq"):
        fam.add(seq, space=slug)
    return fam


def _messages(ids: list[int], slugs: dict[int, str]) -> Family:
    fam = Family("veronica_messages_total", "counter", "Messages delivered (one per recipient).")
    for row in _counts(Message.objects.filter(space_id__in=ids), "space_id"):
        fam.add(row["n"], space=slugs[row["space_id"]])
    return fam


def _unread(ids: list[int], slugs: dict[int, str]) -> Family:
    fam = Family("veronica_messages_unread", "gauge", "Unread mail waiting for members.")
    qs = Message.objects.filter(space_id__in=ids, recipient__isnull=False, read_at__isnull=True)
    for row in _counts(qs, "space_id"):
        fam.add(row["n"], space=slugs[row["space_id"]])
    return fam


def _tasks(ids: list[int], slugs: dict[int, str]) -> Family:
    fam = Family("veronica_tasks", "gauge", "Tasks by status.")
    for row in _counts(Task.objects.filter(space_id__in=ids), "space_id", "status"):
        fam.add(row["n"], space=slugs[row["space_id"]], status=row["status"])
    return fam


def _members(ids: list[int], slugs: dict[int, str]) -> Family:
    fam = Family("veronica_members", "gauge", "Live members by membership and run status.")
    counts: dict[tuple, int] = defaultdict(int)
    for row in _counts(Member.objects.filter(space_id__in=ids, removed_at__isnull=True), "space_id", "membership", "run_status"):
        counts[(slugs[row["space_id"]], row["membership"], row["run_status"])] += row["n"]
    for (space, membership, status), n in sorted(counts.items()):
        fam.add(n, space=space, membership=membership, run_status=status)
    return fam


def _approvals(ids: list[int], slugs: dict[int, str]) -> Family:
    fam = Family("veronica_approvals_pending", "gauge", "Tool calls waiting for an operator.")
    for row in _counts(Approval.objects.filter(space_id__in=ids, status=ApprovalStatus.PENDING), "space_id"):
        fam.add(row["n"], space=slugs[row["space_id"]])
    return fam


def _checks(ids: list[int], slugs: dict[int, str]) -> Family:
    fam = Family("veronica_checks_total", "counter", "Verify checks by result: run (all), failed (including timed out), timed_out.")
    for space_id, row in sorted(checks.counts(ids).items(), key=lambda kv: slugs[kv[0]]):
        for result in ("run", "failed", "timed_out"):
            fam.add(row[result], space=slugs[space_id], result=result)
    return fam


def _deliveries(ids: list[int], slugs: dict[int, str]) -> Family:
    fam = Family("veronica_notifications_total", "counter", "Outbound ops-alert notifications by channel and status.")
    for row in _counts(NotificationDelivery.objects.filter(space_id__in=ids), "space_id", "channel", "status"):
        fam.add(row["n"], space=slugs[row["space_id"]], channel=row["channel"], status=row["status"])
    return fam


def _alerts(ids: list[int], slugs: dict[int, str]) -> Family:
    fam = Family("veronica_ops_alerts_total", "counter",
                 "Ops alerts raised (each also mailed and notified), by kind: stale_task reminders, mailbox_backlog, stuck_run, ...")
    for space_id, subject, count in AlertTally.objects.filter(space_id__in=ids).order_by("space_id", "subject").values_list(
            "space_id", "subject", "count"):
        fam.add(count, space=slugs[space_id], alert=subject.replace(" ", "_"))
    return fam


def _process() -> list[Family]:
    """This process's start (the uptime anchor; each web process answers for itself)."""
    from veronica.apps import STARTED_AT

    start = Family("veronica_process_start_time_seconds", "gauge", "When this process started, in Unix seconds.")
    start.add(round(STARTED_AT, 3))
    uptime = Family("veronica_uptime_seconds", "gauge", "Seconds since this process started.")
    uptime.add(round(time.time() - STARTED_AT, 3))
    return [start, uptime]
