"""Benchmark: a fleet at scale (issue 25, points 3 and 4). bench/fleet.py imports the two figures.

    .venv/bin/python bench/fleet_scale.py [--mode embedded|hosted|both] [--spaces 1000] [--members 10]
        [--events 1000000] [--tasks 100000] [--messages-per-member 10000] [--big-members 50] [--reps 30]
        [--reuse-db NAME]   (hosted, --only big: build the big space once into database NAME, measure it on each run)

idle_figures(mode): SPACES spaces of MEMBERS members each, created through `register` (a manifest
folder per space; half the members carry a cron schedule that does not fire within the day), then
engine ticks with nothing due: statements and ms per tick (against the same tick on an empty
database), wakes and runs started (none: an idle day costs no model call), the statements an idle
day of ticks costs, and register's cost per space early and late (linear: the same) and per member.

big_space_figures(mode): one space with EVENTS events, TASKS tasks, BIG_MEMBERS members and
MESSAGES_PER_MEMBER messages each (bulk inserts), then each page the console and the API serve (with the
parts the space page's script loads after it: the board, the usage bars):
its statements at 1% of the size and at full size (fixed: the same), its p50 / p99 over REPS requests,
its CPU ms (this process: Django's side) and PostgreSQL's own execution time of its statements
(db_exec_ms: what the database does for the page, apart from a loaded host's scheduling).
Retention: a month of steady work (a day's worth of rows a day, retention_days=7) purged by the
engine tick's pass stays flat in rows.

Each mode runs in a child process on a throwaway database (bench/_setup.py). The host is shared:
the load average is printed with the figures; run smaller sizes while it is loaded.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._setup import PG, REPO, django_setup, isolated_env, pct  # noqa: E402

GOALS = {
    "idle_members": "10,000",
    "tick_statements_10k_idle": "= tick_statements_empty (nothing per member)",
    "tick_ms_10k_idle": "small, ~ tick_ms_empty",
    "tick_seq_scans": "[] (every read index-driven)",
    "idle_wakes_per_day": "0",
    "idle_runs_per_day": "0 (no model call)",
    "register_queries_per_member": "constant (linear)",
    "register_ms_late_over_early": "~1 (linear)",
    "page_p99_ms_big_space": "<= 100 (hosted)",
    "page_queries_fixed": "true",
    "retention_rows_flat": "true",
}
IDLE_DEFAULTS = {"spaces": 1000, "members": 10, "ticks": 20}
BIG_DEFAULTS = {"events": 1_000_000, "tasks": 100_000, "messages_per_member": 10_000, "big_members": 50, "reps": 30}
NEVER_TODAY = "0 0 29 2 *"  # Feb 29th: armed, never due within the bench's day


# --- the parent side: run a child per mode ---------------------------------------------------------------

def _child(mode: str, what: str, params: dict) -> dict:
    with isolated_env(mode, f"bench_scale_{what}") as env:
        if params.get("reuse_db"):  # a kept database: the big space is built once, then measured run after run
            env["DATABASE_URL"] = f"{PG}/{params['reuse_db']}"
        proc = subprocess.run([sys.executable, __file__, "--child", what, "--params", json.dumps(params)], cwd=REPO, env=env,
                              capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} ({mode}) failed:\n{proc.stderr[-4000:]}")
    return {"mode": mode, **json.loads(proc.stdout.strip().splitlines()[-1]), "load_avg": os.getloadavg()[0]}


def idle_figures(mode: str, **sizes) -> dict:
    return _child(mode, "idle", {**IDLE_DEFAULTS, **sizes})


def big_space_figures(mode: str, reuse_db: str = "", **sizes) -> dict:
    if reuse_db and mode != "hosted":
        raise SystemExit("--reuse-db names a PostgreSQL database: it goes with --mode hosted")
    return _child(mode, "big", {**BIG_DEFAULTS, **sizes, "reuse_db": reuse_db})


# --- the child side --------------------------------------------------------------------------------------

def _migrate() -> None:
    django_setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


SLOWEST: dict = {}  # the slowest statement of the last capture: where a slow page spends its time


def _statements(fn) -> tuple[int, float, object]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    connection.queries_log.clear()  # a full log (9,000 entries) would count every later capture as 0
    with CaptureQueriesContext(connection) as queries:
        start = time.perf_counter()
        result = fn()
        ms = (time.perf_counter() - start) * 1000
    if queries.captured_queries:
        top = max(queries.captured_queries, key=lambda q: float(q["time"]))
        SLOWEST.update(ms=round(float(top["time"]) * 1000, 1), sql=top["sql"][:300])
    return len(queries), ms, result


def write_manifest(folder: Path, slug: str, members: int, cron_every: int = 2) -> Path:
    """A manifest folder: a leader and members-1 workers; every cron_every-th member has a schedule."""
    (folder / "members").mkdir(parents=True, exist_ok=True)
    (folder / "space.toml").write_text(f'name = "{slug}"\nslug = "{slug}"\n')
    for i in range(members):
        name = "lead" if i == 0 else f"m{i}"
        (folder / "members" / name).mkdir(exist_ok=True)
        schedule = f'schedule = "{NEVER_TODAY}"\n' if i % cron_every == 1 else ""
        (folder / "members" / name / "member.toml").write_text(
            f'role = "{"leader" if i == 0 else "worker"}"\nmodel = "offline"\n{schedule}')
        (folder / "members" / name / "persona.md").write_text(f"You are {name}.\n")
    return folder


def _idle_ticks(ticks: int) -> tuple[int, float, float, int]:
    """(max statements, p50 ms, p99 ms, wakes enqueued) over `ticks` idle ticks."""
    from veronica.engine import retention, tick

    woken = []
    real = tick.enqueue_wake
    tick.enqueue_wake = lambda pk, source: woken.append(pk)
    retention._last_purge = time.monotonic()  # the daily purge pass is measured on its own (big space)
    try:
        counts, times = [], []
        for _ in range(ticks):
            n, ms, _ = _statements(tick.tick)
            counts.append(n)
            times.append(ms)
    finally:
        tick.enqueue_wake = real
    return max(counts), pct(times, 50), pct(times, 99), len(woken)


def tick_seq_scans() -> list[str]:
    """The tables of more than 1,000 rows an idle tick reads by scanning them whole (PostgreSQL's plans;
    SQLite: not measured)."""
    import re

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from veronica.engine import tick

    if connection.vendor != "postgresql":
        return []
    with CaptureQueriesContext(connection) as queries:
        tick.tick()
    scanned = set()
    with connection.cursor() as cur:
        for q in queries.captured_queries:
            if q["sql"].lstrip().upper().startswith("SELECT"):
                cur.execute("EXPLAIN " + q["sql"])
                plan = "\n".join(row[0] for row in cur.fetchall())
                scanned.update(re.findall(r"Seq Scan on (\w+)", plan))
        # a planner scans a table of a few rows whole whatever its indexes: only big tables count
        cur.execute("SELECT relname FROM pg_class WHERE relname = ANY(%s) AND reltuples > 1000", [sorted(scanned)])
        return sorted(row[0] for row in cur.fetchall())


def child_idle(p: dict) -> dict:
    import tempfile

    _migrate()
    from django.conf import settings

    from veronica.portable.manifest import register_space
    from veronica.models import Member, Run, Wake

    empty_statements, empty_ms, _, _ = _idle_ticks(p["ticks"])
    root = Path(tempfile.mkdtemp(prefix="fleet-scale-", dir=settings.DATA_DIR))
    manifest = write_manifest(root / "manifest", "x", p["members"])
    register_ms = []
    register_queries = []
    for s in [*range(p["spaces"]), "wide"]:
        (root / "ws" / str(s)).mkdir(parents=True)
    for s in range(p["spaces"]):
        n, ms, _ = _statements(lambda: register_space(str(manifest), slug=f"s{s}", name=f"S{s}", workdir=str(root / "ws" / str(s))))
        register_ms.append(ms)
        register_queries.append(n)
    # queries per member: the same manifest with twice the members
    wide = write_manifest(root / "wide", "w", p["members"] * 2)
    wide_queries, _, _ = _statements(lambda: register_space(str(wide), slug="wide", name="Wide", workdir=str(root / "ws" / "wide")))
    per_member = (wide_queries - register_queries[-1]) / p["members"]
    members = Member.objects.filter(removed_at__isnull=True).exclude(space__slug="wide").count()
    runs_before, wakes_before = Run.objects.count(), Wake.objects.count()
    _analyze()
    statements, p50, p99, woken = _idle_ticks(p["ticks"])
    decile = max(1, len(register_ms) // 10)
    early, late = sorted(register_ms[:decile])[decile // 2], sorted(register_ms[-decile:])[decile // 2]
    ticks_per_day = round(86400 / settings.ENGINE_TICK_SECONDS)
    return {
        "idle_members": members,
        "scheduled_members": Member.objects.exclude(schedule="").exclude(space__slug="wide").count(),
        "tick_statements_empty": empty_statements,
        "tick_statements_10k_idle": statements,
        "tick_ms_empty": round(empty_ms, 2),
        "tick_ms_10k_idle": round(p50, 2),
        "tick_ms_p99_10k_idle": round(p99, 2),
        "idle_wakes_per_day": woken * ticks_per_day // p["ticks"],
        "idle_runs_per_day": Run.objects.count() - runs_before + Wake.objects.count() - wakes_before,
        "idle_day_statements": statements * ticks_per_day,
        "tick_seq_scans": tick_seq_scans(),
        "register_queries_per_space": register_queries[-1],
        "register_queries_per_member": per_member,
        "register_ms_early": round(early, 1),
        "register_ms_late": round(late, 1),
        "register_ms_late_over_early": round(late / early, 2),
    }


def _bulk(model, rows: list, batch: int = 5000) -> None:
    model.objects.bulk_create(rows, batch_size=batch)


def seed_big(space, members: list, events: int, tasks: int, messages_per_member: int, start: dict) -> dict:
    """Add rows up to the given totals (start holds what is there already)."""
    from django.utils import timezone

    from veronica.models import Event, Message, Space, Task

    now = timezone.now()
    head = Space.objects.filter(pk=space.pk).values_list("event_seq", flat=True).get()  # verbs may have emitted since
    adding = max(0, events - start["events"])
    step = 20000
    for lo in range(head, head + adding, step):
        _bulk(Event, [Event(space=space, seq=i + 1, kind="bench.step", payload={"member_name": "m1", "n": i}, created_at=now)
                      for i in range(lo, min(head + adding, lo + step))])
    Space.objects.filter(pk=space.pk).update(event_seq=head + adding)
    statuses = ["done"] * 8 + ["pending", "running"]
    for lo in range(start["tasks"], tasks, step):
        _bulk(Task, [Task(space=space, title=f"task {i}", creator_name="lead", assignee=members[i % len(members)],
                          status=statuses[i % len(statuses)]) for i in range(lo, min(tasks, lo + step))])
    for member in members:
        have = start["messages_per_member"]
        for lo in range(have, messages_per_member, step):
            _bulk(Message, [Message(space=space, sender=members[0], sender_name=members[0].name, recipient=member,
                                    recipient_name=member.name, body=f"note {i}", read_at=now)
                            for i in range(lo, min(messages_per_member, lo + step))])
    return {"events": start["events"] + adding, "tasks": max(tasks, start["tasks"]),
            "messages_per_member": max(messages_per_member, start["messages_per_member"])}


def pages_of(space, member, task, run) -> dict:
    from veronica.web import consumers

    s = space.slug

    def replay():
        """The socket's connect-time reads (its head, then the replay batch), run as the consumer runs them
        but on this thread (the consumer wraps them in database_sync_to_async)."""
        last = consumers._head.func(space.pk)
        return consumers._events_after.func(space.pk, max(0, last - 200))

    return {
        "space": f"/spaces/{s}/",
        "board": f"/spaces/{s}/panels/tasks/",  # the space page's script loads it (and the usage bars) after the page
        "usage_bars": f"/spaces/{s}/panels/usage/",
        "timeline": lambda: f"/api/spaces/{s}/events/?after={max(0, _head_seq(space) - 200)}&limit=200",
        "member": f"/spaces/{s}/members/{member.name}/",
        "task": f"/spaces/{s}/tasks/{task.pk}/",
        "run": f"/spaces/{s}/runs/{run.pk}/",
        "api_spaces": "/api/spaces/",
        "api_tasks": f"/api/spaces/{s}/tasks/",  # newest first, whatever their status
        "socket_replay": replay,
    }


def _head_seq(space) -> int:
    from veronica.models import Space

    return Space.objects.filter(pk=space.pk).values_list("event_seq", flat=True).get()


def measure_pages(client, pages: dict, reps: int) -> dict:
    out = {}
    for name, target in pages.items():
        def once():
            if callable(target) and not isinstance(target, str):
                got = target()
                if isinstance(got, str):
                    return client.get(got)
                return got
            return client.get(target)

        queries, _, response = _statements(once)
        status = getattr(response, "status_code", 200)
        if status != 200:
            raise RuntimeError(f"{name}: HTTP {status}")
        slowest = dict(SLOWEST)
        times, cpu = [], []
        for _ in range(reps):  # timed as served: without the capture's debug cursor (it renders each statement's SQL)
            started, wall = time.process_time(), time.perf_counter()
            once()
            times.append((time.perf_counter() - wall) * 1000)
            cpu.append((time.process_time() - started) * 1000)
        out[name] = {"queries": queries}
        if times:
            out[name]["slowest_query"] = slowest
            out[name].update(p50_ms=round(pct(times, 50), 1), p99_ms=round(pct(times, 99), 1), cpu_ms_p50=round(pct(cpu, 50), 1),
                             db_exec_ms=db_exec_ms(once))
    return out


def db_exec_ms(request) -> float | None:
    """PostgreSQL's own execution time (EXPLAIN ANALYZE) summed over one request's SELECTs: the database's
    work on the page, which a loaded host's scheduling does not inflate the way it does wall time.
    (None on SQLite.)"""
    import re

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    if connection.vendor != "postgresql":
        return None
    connection.queries_log.clear()
    with CaptureQueriesContext(connection) as queries:
        request()
    total = 0.0
    with connection.cursor() as cur:
        for q in queries.captured_queries:
            if q["sql"].lstrip().upper().startswith("SELECT"):
                cur.execute("EXPLAIN (ANALYZE) " + q["sql"])
                total += float(re.search(r"Execution Time: ([\d.]+)", "\n".join(row[0] for row in cur.fetchall())).group(1))
    return round(total, 2)


def _build_space(slug: str, p: dict, sizes: dict):
    """A space of p["big_members"] members (20 ended runs each) seeded up to `sizes`; with p["reuse_db"], one
    already there at those sizes is taken as it is (seeded once, measured run after run)."""
    import tempfile

    from django.conf import settings
    from django.utils import timezone

    from veronica.engine import supervisor
    from veronica.models import Member, Role, Run, Space

    space = Space.objects.filter(slug=slug).first()
    if space is not None and p.get("reuse_db"):
        members = list(Member.objects.filter(space=space).order_by("id"))
        if len(members) == p["big_members"] and space.event_seq >= sizes["events"]:
            return space, members, sizes
        raise SystemExit(f"--reuse-db: space {slug!r} there is not of these sizes; drop the database to build it anew")
    workdir = tempfile.mkdtemp(dir=settings.DATA_DIR)  # gone with the run's data dir: a kept space keeps its own
    if p.get("reuse_db"):
        workdir = REPO / "data" / "bench-reuse" / p["reuse_db"] / slug
        workdir.mkdir(parents=True, exist_ok=True)
    space = Space.objects.create(name=slug.title(), slug=slug, workdir=str(workdir))
    members = [supervisor.add_member(space, "lead", role=Role.LEADER, actor="bench")]
    members += [supervisor.add_member(space, f"m{i}", actor="bench") for i in range(1, p["big_members"])]
    now = timezone.now()
    Run.objects.bulk_create([Run(member=m, source="message", lease_token="t", started_at=now, ended_at=now, outcome="done",
                                 steps=3) for m in members for _ in range(20)])
    have = {"events": Space.objects.get(pk=space.pk).event_seq, "tasks": 0, "messages_per_member": 0}
    return space, members, seed_big(space, members, sizes["events"], sizes["tasks"], sizes["messages_per_member"], have)


def _pages_for(space, members):
    from veronica.models import Run, Task

    space.refresh_from_db()
    task = Task.objects.filter(space=space).order_by("id").first()
    run = Run.objects.filter(member=members[1]).order_by("id").first()
    return pages_of(space, members[1], task, run)


def child_big(p: dict) -> dict:
    _migrate()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client

    settings.ALLOWED_HOSTS = ["*"]
    User = get_user_model()
    user = User.objects.filter(username="bench").first() or User.objects.create_superuser("bench", "bench@example.com", "x")
    client = Client()
    client.force_login(user)
    full = {k: p[k] for k in ("events", "tasks", "messages_per_member")}
    small = {k: max(1, v // 100) for k, v in full.items()}
    t0 = time.perf_counter()
    if p.get("reuse_db"):  # two spaces side by side (the 1% one and the full one), both kept for the next run
        small_space, small_members, _ = _build_space("small", p, small)
        at_small = measure_pages(client, _pages_for(small_space, small_members), 2)
        space, members, have = _build_space("big", p, full)
    else:  # one space measured at 1%, then grown to full size
        space, members, have = _build_space("big", p, small)
        at_small = measure_pages(client, _pages_for(space, members), 2)
        have = seed_big(space, members, full["events"], full["tasks"], full["messages_per_member"], have)
    seed_s = time.perf_counter() - t0
    pages = _pages_for(space, members)
    _analyze()
    # The pages are served here as daphne serves them once it has answered its first request: with its
    # collector settled (veronica.plumbing.gcsettle). Unsettled, a full pass walked ~1M objects (~85 ms)
    # two or three times during the measurement, and the page it landed in read ~100 ms at p99.
    from veronica.plumbing import gcsettle

    gcsettle.settle()
    at_full = measure_pages(client, pages, p["reps"])
    fixed = {name: at_small[name]["queries"] == at_full[name]["queries"] for name in pages}
    return {
        "big_space": {"events": have["events"], "tasks": have["tasks"], "members": len(members),
                      "messages": have["messages_per_member"] * len(members), "seed_s": round(seed_s, 1)},
        "pages": {name: {**at_full[name], "queries_at_1pct": at_small[name]["queries"]} for name in pages},
        "page_queries_fixed": all(fixed.values()),
        "page_p99_ms_big_space": max(v["p99_ms"] for v in at_full.values()),
        **({} if p.get("reuse_db") else retention_month()),  # a kept database keeps no steady month
    }


def _analyze() -> None:
    from django.db import connection

    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("VACUUM ANALYZE")  # what autovacuum leaves behind bulk loads: statistics, the visibility map


def retention_month(days: int = 30, keep_days: int = 7, per_day: int = 2000) -> dict:
    """A month of steady work in a space with retention_days=keep_days: each simulated day adds a day's
    events and read mail (stamped that day), then the engine tick's purge pass runs; rows after the first
    week stay flat."""
    import tempfile
    from datetime import timedelta

    from django.conf import settings
    from django.utils import timezone

    from veronica.engine import retention, supervisor
    from veronica.models import Event, Message, Role, Space

    space = Space.objects.create(name="Steady", slug="steady", workdir=tempfile.mkdtemp(dir=settings.DATA_DIR),
                                 retention_days=keep_days)
    lead = supervisor.add_member(space, "lead", role=Role.LEADER, actor="bench")
    worker = supervisor.add_member(space, "w", actor="bench")
    start = timezone.now() - timedelta(days=days)
    sizes = []
    seq = Space.objects.get(pk=space.pk).event_seq
    fresh = timezone.now() - timedelta(hours=1)  # bulk_create stamps now (auto_now_add): re-stamp the day's rows
    for day in range(days):
        stamp = start + timedelta(days=day)
        _bulk(Event, [Event(space=space, seq=seq + i + 1, kind="bench.step", payload={}) for i in range(per_day)])
        seq += per_day
        Space.objects.filter(pk=space.pk).update(event_seq=seq)
        _bulk(Message, [Message(space=space, sender=lead, sender_name="lead", recipient=worker, recipient_name="w", body="x",
                                read_at=stamp) for _ in range(per_day // 4)])
        Event.objects.filter(space=space, created_at__gt=fresh).update(created_at=stamp)
        Message.objects.filter(space=space, created_at__gt=fresh).update(created_at=stamp)
        while any(retention.purge_space(Space.objects.get(pk=space.pk), now=stamp + timedelta(days=1), announce=False,
                                        max_batches=retention.TICK_BATCHES).values()):
            pass
        sizes.append(Event.objects.filter(space=space).count() + Message.objects.filter(space=space).count())
    settled = sizes[keep_days + 1:]
    return {"retention_rows_by_day": sizes, "retention_rows_flat": max(settled) - min(settled) <= per_day * 1.25 * 1.05}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["embedded", "hosted", "both"], default="both")
    parser.add_argument("--only", choices=["idle", "big", "both"], default="both")
    for key, value in {**IDLE_DEFAULTS, **BIG_DEFAULTS}.items():
        parser.add_argument(f"--{key.replace('_', '-')}", type=int, default=value)
    parser.add_argument("--reuse-db", default="", help="hosted, big space only: build the big space once into this "
                        "PostgreSQL database (kept) and measure it there on each later run")
    parser.add_argument("--child")
    parser.add_argument("--params")
    args = parser.parse_args()
    if args.child:
        print(json.dumps({"idle": child_idle, "big": child_big}[args.child](json.loads(args.params))))
        return
    sizes = vars(args)
    modes = ["embedded", "hosted"] if args.mode == "both" else [args.mode]
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    report = {}
    for mode in modes:
        figures = {}
        if args.only in ("idle", "both"):
            figures.update(idle_figures(mode, **{k: sizes[k] for k in IDLE_DEFAULTS}))
        if args.only in ("big", "both"):
            figures.update(big_space_figures(mode, reuse_db=args.reuse_db, **{k: sizes[k] for k in BIG_DEFAULTS}))
        for key, value in figures.items():
            if key == "pages":
                for page, row in value.items():
                    print(f"[{mode}] page {page:14} {row}")
                continue
            goal = GOALS.get(key)
            print(f"[{mode}] {key:30} {value}" + (f"   (goal: {goal})" if goal else ""), flush=True)
        report[mode] = figures
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
