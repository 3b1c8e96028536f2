"""Per-member series and the engine's counts for /metrics (veronica.ops.metrics renders them too).

The per-space families stay as they are; these add a `member` label beside `space` (sum by space
gives the space's figure back). Engine counts are read from rows that are never purged: spawned
and retired from the clones' Member rows (removal is soft), dispatched from engine-managed tasks
that started.
"""
from __future__ import annotations

from datetime import timedelta

from django.db.models import Count, Q, Sum

from veronica.ops.metrics_family import Family, _counts, _histogram, add_histogram, run_durations
from veronica.models import Member, Run, Task, UsageDay, Wake


def families(ids: list[int], slugs: dict[int, str]) -> list[Family]:
    names = dict(Member.objects.filter(space_id__in=ids).values_list("pk", "name"))
    return [_wakes(ids, slugs, names), _runs(ids, slugs, names), _tokens(ids, slugs, names), _usd(ids, slugs, names),
            _run_duration(ids, slugs, names), _run_tokens(ids, slugs, names), _engine(ids, slugs)]


# The seed's coarse per-member buckets (<10 s, <1 min, <10 min, more; <1k, <10k, <50k, more): with the
# member label, the space's finer buckets would multiply the series by every member.
DURATION_BUCKETS = (10, 60, 600)
TOKEN_BUCKETS = (1000, 10000, 50000)
BY_MEMBER = ("member__space_id", "member_id")


def _run_duration(ids, slugs, names) -> Family:
    fam = Family("veronica_member_run_duration_seconds", "histogram", "Wall time of finished runs per live member (coarse buckets).")
    qs = run_durations(ids).filter(member__removed_at__isnull=True)  # a retired clone's series go with it
    for row in _histogram(qs, "duration", DURATION_BUCKETS, lambda b: timedelta(seconds=b), BY_MEMBER):
        total = row["total_sum"] or timedelta(0)
        add_histogram(fam, row, DURATION_BUCKETS, round(total.total_seconds(), 3), space=slugs[row["member__space_id"]],
                      member=names[row["member_id"]])
    return fam


def _run_tokens(ids, slugs, names) -> Family:
    fam = Family("veronica_member_run_tokens", "histogram", "Tokens used per finished run per live member (coarse buckets).")
    qs = Run.objects.filter(member__space_id__in=ids, ended_at__isnull=False, member__removed_at__isnull=True)
    for row in _histogram(qs, "tokens", TOKEN_BUCKETS, lambda b: b, BY_MEMBER):
        add_histogram(fam, row, TOKEN_BUCKETS, row["total_sum"] or 0, space=slugs[row["member__space_id"]],
                      member=names[row["member_id"]])
    return fam


def _wakes(ids, slugs, names) -> Family:
    fam = Family("veronica_member_wakes_total", "counter", "Wakes received, per member, by source and whether they claimed the run slot.")
    for row in _counts(Wake.objects.filter(member__space_id__in=ids), "member__space_id", "member_id", "source", "claimed"):
        fam.add(row["n"], space=slugs[row["member__space_id"]], member=names[row["member_id"]], source=row["source"],
                claimed=str(row["claimed"]).lower())
    return fam


def _runs(ids, slugs, names) -> Family:
    fam = Family("veronica_member_runs_total", "counter", "Runs per member by outcome (running = in flight).")
    for row in _counts(Run.objects.filter(member__space_id__in=ids), "member__space_id", "member_id", "outcome"):
        fam.add(row["n"], space=slugs[row["member__space_id"]], member=names[row["member_id"]], outcome=row["outcome"])
    return fam


def _tokens(ids, slugs, names) -> Family:
    fam = Family("veronica_member_tokens_total", "counter", "Model tokens metered per member, by class.")
    rows = UsageDay.objects.filter(space_id__in=ids).values("space_id", "member_id").annotate(
        input=Sum("input_tokens"), output=Sum("output_tokens"), cache_read=Sum("cache_read_tokens"),
        cache_write=Sum("cache_write_tokens")).order_by("space_id", "member_id")
    for row in rows:
        for cls in ("input", "output", "cache_read", "cache_write"):
            fam.add(row[cls] or 0, space=slugs[row["space_id"]], member=names[row["member_id"]], **{"class": cls})
    return fam


def _usd(ids, slugs, names) -> Family:
    fam = Family("veronica_member_usd_total", "counter", "Estimated model spend in USD per member.")
    rows = UsageDay.objects.filter(space_id__in=ids).values("space_id", "member_id").annotate(usd=Sum("usd")).order_by("space_id", "member_id")
    for row in rows:
        fam.add(float(row["usd"] or 0), space=slugs[row["space_id"]], member=names[row["member_id"]])
    return fam


def _engine(ids, slugs) -> Family:
    fam = Family("veronica_engine_total", "counter", "Engine tallies: tasks auto-dispatched, clones spawned, clones retired.")
    clones = Member.objects.filter(space_id__in=ids, spawned_from__isnull=False).values("space_id").annotate(
        spawned=Count("id"), retired=Count("id", filter=Q(removed_at__isnull=False))).order_by()
    dispatched = Task.objects.filter(space_id__in=ids, engine_managed=True, started_at__isnull=False).values("space_id").annotate(
        n=Count("id")).order_by()
    counts = {space_id: {"dispatched": 0, "spawned": 0, "retired": 0} for space_id in ids}
    for row in clones:
        counts[row["space_id"]].update(spawned=row["spawned"], retired=row["retired"])
    for row in dispatched:
        counts[row["space_id"]]["dispatched"] = row["n"]
    for space_id in sorted(ids, key=lambda i: slugs[i]):
        for kind in ("dispatched", "spawned", "retired"):
            fam.add(counts[space_id][kind], space=slugs[space_id], kind=kind)
    return fam
