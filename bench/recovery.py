"""Recovery under SIGKILL chaos, embedded (SQLite) and hosted (PostgreSQL + Redis).

N qcluster process groups (each one a "host": `manage.py qcluster` in its own session, with its
engine ticker) work a bounded stream of tasks assigned to M members by mail; every few seconds one
group is SIGKILLed (workers mid-run, and the active ticker whenever it is that group's) and a fresh
one started in its place; then the stream drains. Printed per mode:

* messages sent / read / lost (assignment mail still unread after the drain), tasks whose mail was
  read but that never finished (still open after the drain; tasks the worker reported failed are
  counted apart), answers (task_done calls) and duplicate answers (a task answered more than once);
* overlapping runs (two runs of one member whose intervals intersect);
* stuck members (still leased, busy or with unread mail after the drain);
* kill -> running again p50 / p99 / max: for every run a kill ended (outcome lease_expired), from
  the kill to that member's next run starting (split into kill -> lease expired, and lease expired
  -> running again: the re-wake and a free worker). The goal is <= lease + 5 s.

`--skew SECONDS` runs every qcluster group with its wall clock shifted (only what Python reads:
tests/skewed_clock on its PYTHONPATH; the database and this measuring process keep true time), so
a host clock ahead (> 0) or behind (< 0) can be compared with the control at the same load. The
1-minute load average is printed beside each figure (at the start and at the end of its phase).

`--partition SECONDS` (hosted only; needs root, unshare, nsenter and ip) adds a phase after the
drain: one more qcluster group runs in a network namespace that reaches PostgreSQL over a veth pair
(tests/netns.py), which is taken down for SECONDS while mail streams to the members; the figures
are the mail's wait (sent -> read) during the cut, p50 / p99 / max, the wakes the cut host held on
a database timeout, and the wait of mail sent just before the heal.

Usage: .venv/bin/python bench/recovery.py [--modes embedded,hosted] [--groups 3] [--members 8]
       [--messages 120] [--kill-every 4] [--lease 10] [--skew SECONDS] [--partition SECONDS]
The last line is one JSON object with those figures per mode.
Each mode uses its own data folder, PostgreSQL database and queue name, and drops them afterwards.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._setup import REPO, QCluster  # noqa: E402


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def start_group(env: dict, workers: int, log_dir: Path, n: int) -> QCluster:
    """One qcluster process group, standing for one worker host."""
    return QCluster({**env, "VERONICA_Q_WORKERS": str(workers)}, log_dir / f"group-{n}.log", grace=15)


def create(space, member, n: int) -> None:
    """One task for the stream. A deadlock victim is retried (and counted): older engines ordered the
    member and space row locks differently and PostgreSQL broke the cycle by failing this write."""
    from django.db import OperationalError

    from veronica.swarm import ledger

    for attempt in range(3):
        try:
            ledger.create_task(space, "bench", f"Check part{n % 6}.py (job {n})", assignee=member)
            return
        except OperationalError as exc:
            DEADLOCKS.append(str(exc).splitlines()[0])
    raise RuntimeError(f"task {n} failed three times: {DEADLOCKS[-1]}")


DEADLOCKS: list[str] = []


def child(args) -> dict:
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "veronica.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django.db import close_old_connections
    from django.utils import timezone

    from veronica.swarm import ledger
    from veronica.engine import supervisor
    from veronica.models import Member, Message, Role, Run, RunOutcome, Space, Task, TaskStatus, Turn, Wake

    load_start = os.getloadavg()[0]
    workdir = Path(tempfile.mkdtemp(prefix="bench-recovery-ws-"))
    for i in range(6):
        (workdir / f"part{i}.py").write_text("".join(f"def f{j}():\n    return {j}  # TODO tidy\n" for j in range(30)))
    (workdir / "README.md").write_text("# bench\n")
    space = Space.objects.create(name="recovery", slug=f"recovery-{uuid.uuid4().hex[:6]}", workdir=str(workdir))
    supervisor.add_member(space, "lead", role=Role.LEADER, actor="bench")
    members = [supervisor.add_member(space, f"w{i}", actor="bench") for i in range(args.members)]

    env = os.environ.copy()
    env.update(VERONICA_RUN_LEASE_SECONDS=str(args.lease), VERONICA_ENGINE_TICK_SECONDS=str(args.tick),
               VERONICA_OFFLINE_DELAY_MS=str(args.delay_ms), VERONICA_Q_STOP_GRACE="5", LOG_LEVEL=os.environ.get("BENCH_LOG_LEVEL", "WARNING"))
    log_dir = Path(os.environ["VERONICA_DATA_DIR"])
    serial = iter(range(10**6))
    if args.skew:  # the hosts' clocks are wrong, not the measurer's
        env = {**env, "PYTHONPATH": str(REPO / "tests" / "skewed_clock"), "VERONICA_TEST_CLOCK_SKEW": str(args.skew)}
    groups = [start_group(env, args.workers, log_dir, next(serial)) for _ in range(args.groups)]
    time.sleep(3)
    rng = random.Random(7)
    kills: list = []
    victims: list[tuple] = []  # (member id, lease token, its expiry then, kill time)
    pending = None

    def leases_held() -> dict:
        close_old_connections()
        return {pk: (token, expires) for pk, token, expires in
                Member.objects.filter(space=space).exclude(lease_token="").values_list("pk", "lease_token", "lease_expires_at")}

    def stopped_renewing(killed_at, before: dict) -> list[tuple]:
        now_held = leases_held()  # a live run renews every second; the killed group's runs do not
        return [(pk, token, expires, killed_at) for pk, (token, expires) in before.items() if now_held.get(pk) == (token, expires)]
    sent = 0
    started = time.monotonic()
    next_kill = started + args.kill_every
    interval = args.stream_seconds / args.messages
    while sent < args.messages:
        now = time.monotonic()
        if pending and now >= pending[0] + 2.5:
            victims.extend(stopped_renewing(*pending[1:]))  # leases the kill froze were that group's runs
            pending = None
        if now >= next_kill:
            victim = rng.randrange(len(groups))
            before = leases_held()
            groups[victim].kill()
            kills.append(timezone.now())
            pending = (now, kills[-1], before)
            groups[victim] = start_group(env, args.workers, log_dir, next(serial))
            next_kill = now + args.kill_every
        member = members[sent % len(members)]
        create(space, member, sent)
        sent += 1
        time.sleep(interval)

    deadline = time.monotonic() + args.drain_timeout

    def quiet() -> bool:
        close_old_connections()
        return (not Task.objects.filter(space=space).exclude(status=TaskStatus.DONE).exists()
                and not Message.objects.filter(space=space, read_at__isnull=True).exists()
                and not Member.objects.filter(space=space).exclude(lease_token="").exists())

    while time.monotonic() < deadline and not quiet():
        if pending and time.monotonic() >= pending[0] + 2.5:
            victims.extend(stopped_renewing(*pending[1:]))
            pending = None
        time.sleep(0.5)
    drained_after = time.monotonic() - started
    load_chaos = os.getloadavg()[0]
    cut = partition(args, env, space, members, log_dir) if args.partition and os.environ.get("DATABASE_URL") else None
    for group in groups:
        group.stop()

    close_old_connections()
    mails = Message.objects.filter(space=space, task__isnull=False, sender_name="bench")
    # A task whose mail was read ends done, or failed when the worker reported a failure (an honest
    # answer, e.g. after a read the kill interrupted); "never finished" is one still open: work lost.
    unfinished = Task.objects.filter(space=space, status__in=sorted(ledger.OPEN)).count()
    failed = Task.objects.filter(space=space, status=TaskStatus.FAILED).count()
    answers: dict[int, int] = {}
    for calls in Turn.objects.filter(session__member__space=space, role="assistant").values_list("tool_calls", flat=True):
        for call in calls or []:
            if call.get("name") == "task_done":
                task_id = int((call.get("args") or {}).get("task_id") or 0)
                answers[task_id] = answers.get(task_id, 0) + 1
    overlaps = 0
    for member in members:
        runs = list(Run.objects.filter(member=member).order_by("started_at").values_list("started_at", "ended_at"))
        for (_, prev_end), (start, _) in zip(runs, runs[1:]):
            if prev_end is None or start < prev_end:
                overlaps += 1
    recoveries, detections, pickups, slowest = [], [], [], []
    # A dead lease stays frozen across later kills (the first of those ended it); a live run that
    # merely skipped a heartbeat renews later and is frozen again only by the kill that ends it.
    first_kill: dict = {}
    last_state: dict = {}
    for member_id, token, expires, killed_at in victims:
        first_kill.setdefault((member_id, token, expires), killed_at)
        last_state[(member_id, token)] = max(expires, last_state.get((member_id, token), expires))
    first_kill = {(m, t): first_kill[(m, t, e)] for (m, t), e in last_state.items()}
    for (member_id, token), killed_at in first_kill.items():
        expired = Run.objects.filter(member_id=member_id, lease_token=token, outcome=RunOutcome.LEASE_EXPIRED).first()
        if expired is None:
            continue  # it ended on its own in the same instant
        detections.append((expired.ended_at - killed_at).total_seconds())
        rerun = Run.objects.filter(member_id=member_id, started_at__gt=killed_at).order_by("started_at").first()
        recoveries.append((rerun.started_at - killed_at).total_seconds() if rerun else float("inf"))
        pickups.append((rerun.started_at - expired.ended_at).total_seconds() if rerun else float("inf"))
        if rerun:  # what the member's doorbells did between the expiry and the run (the slowest are printed); a
            # wake's row is written after its claim, so the one that started the run is a moment after it
            rung = Wake.objects.filter(member_id=member_id, created_at__gte=expired.ended_at,
                                       created_at__lte=rerun.started_at + timedelta(seconds=1))
            timeline = " ".join(f"{(at - expired.ended_at).total_seconds():+.1f}s {source}{'' if claimed else ' (unclaimed)'}"
                                for at, source, claimed in rung.order_by("created_at").values_list("created_at", "source", "claimed"))
            slowest.append((recoveries[-1], detections[-1], pickups[-1], rung.count(), rung.filter(claimed=False).count(), rerun.source,
                            timeline))
    stuck = set(Member.objects.filter(space=space).exclude(lease_token="").values_list("pk", flat=True))
    stuck |= set(Member.objects.filter(space=space, run_status="busy").values_list("pk", flat=True))
    stuck |= set(Message.objects.filter(space=space, read_at__isnull=True, recipient__isnull=False).values_list("recipient_id", flat=True))
    return {
        "sent": sent, "read": mails.filter(read_at__isnull=False).count(), "lost": mails.filter(read_at__isnull=True).count(), "unfinished": unfinished,
        "answers": sum(answers.values()), "duplicates": sum(n - 1 for n in answers.values() if n > 1),
        "overlaps": overlaps, "stuck": len(stuck), "kills": len(kills), "killed_runs": len(recoveries),
        "detect_p50": pct(detections, 50), "detect_max": max(detections) if detections else None,
        "pickup_p50": pct(pickups, 50), "pickup_p99": pct(pickups, 99), "failed": failed, "load": load_chaos, "load_start": load_start,
        "partition": cut,
        "p50": pct(recoveries, 50), "p99": pct(recoveries, 99), "max": max(recoveries) if recoveries else None,
        "expired_runs": Run.objects.filter(member__space=space, outcome=RunOutcome.LEASE_EXPIRED).count(),
        "deadlocks": len(DEADLOCKS), "lease": args.lease, "slowest": sorted(slowest, reverse=True)[:3], "drained_after": drained_after, "runs": Run.objects.filter(member__space=space).count(),
    }


def partition(args, env: dict, space, members, log_dir: Path) -> dict:
    """A host cut from PostgreSQL only for args.partition seconds while mail streams (see the docstring)."""
    from django.conf import settings
    from django.db import close_old_connections

    from tests.netns import plan, set_database_link, tear_down, unix_to_tcp
    from veronica.swarm import bus
    from veronica.models import Message

    load_start = os.getloadavg()[0]
    sockets = Path(tempfile.mkdtemp(prefix="bench-netns-"))
    route = plan(env["DATABASE_URL"], settings.REDIS_URL)
    relays = [unix_to_tcp(sockets / "pg.sock", *route.pg), unix_to_tcp(sockets / "redis.sock", *route.redis)]
    cut_env = {**env, "DATABASE_URL": route.database_url, "REDIS_URL": route.redis_url, "VERONICA_Q_WORKERS": str(args.workers),
               "LOG_LEVEL": "INFO"}
    log_path = log_dir / "cut-host.log"
    log = open(log_path, "ab")
    launcher = subprocess.Popen(
        ["unshare", "-n", sys.executable, str(REPO / "tests" / "netns.py"), "--pidfile", str(sockets / "q.pid"),
         "--pg-sock", str(sockets / "pg.sock"), "--pg-port", str(route.pg[1]), "--redis-sock", str(sockets / "redis.sock"),
         "--redis-port", str(route.redis[1]), "--db-pidfile", str(sockets / "db.pid"), "--", "manage.py", "qcluster"],
        cwd=REPO, env=cut_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while b"running." not in log_path.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(5)  # its workers warmed up (a warm-up cut off holds its worker, and so a wake, for the timeouts)
    db_pid = int((sockets / "db.pid").read_text())
    try:
        set_database_link(db_pid, False)
        cut_at = time.monotonic()
        sent, last = [], []
        n = 0
        while time.monotonic() - cut_at < args.partition:
            member = members[n % len(members)]
            close_old_connections()
            message = bus.send(space, "operator", member.name, f"partition ping {n}")[0]
            (last if args.partition - (time.monotonic() - cut_at) < 3 else sent).append(getattr(message, "pk", None))
            n += 1
            time.sleep(args.partition_interval)
        set_database_link(db_pid, True)
        wait_until = time.monotonic() + 90
        ids = [pk for pk in sent + last if pk]
        while time.monotonic() < wait_until and Message.objects.filter(pk__in=ids, read_at__isnull=True).exists():
            time.sleep(0.5)
            close_old_connections()
    finally:
        tear_down(launcher, relays)
        log.close()
        shutil.rmtree(sockets, ignore_errors=True)
    waits = [(m.read_at - m.created_at).total_seconds() if m.read_at else float("inf")
             for m in Message.objects.filter(pk__in=[pk for pk in sent if pk])]
    late = [(m.read_at - m.created_at).total_seconds() if m.read_at else float("inf")
            for m in Message.objects.filter(pk__in=[pk for pk in last if pk])]
    text = log_path.read_text(errors="replace")
    return {"seconds": args.partition, "mails": len(waits), "p50": pct(waits, 50), "p99": pct(waits, 99),
            "max": max(waits) if waits else None, "held_on_timeout": text.count("the database is unreachable"),
            "handed_back": text.count("handed back"), "before_heal_max": max(late) if late else None,
            "load_start": load_start, "load": os.getloadavg()[0]}


def spawn(mode: str, args) -> dict:
    tag = f"{os.getpid()}_{uuid.uuid4().hex[:6]}"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    data_dir = Path(tempfile.mkdtemp(prefix=f"bench-recovery-{mode}-"))
    env.update(VERONICA_DATA_DIR=str(data_dir), VERONICA_Q_NAME=f"bench-recovery-{tag}")
    database = f"bench_recovery_{tag}"
    psql = ["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc"]
    if mode == "hosted":
        subprocess.run([*psql, f"CREATE DATABASE {database}"], check=True, capture_output=True)
        env["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{database}"
        env["REDIS_URL"] = args.redis
    try:
        forwarded = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in ("child", "modes", "keep")]
        proc = subprocess.run([sys.executable, __file__, "--child", mode, *forwarded], cwd=REPO, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{mode} run failed:\n{proc.stderr[-3000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        if mode == "hosted":
            subprocess.run([*psql, f"DROP DATABASE IF EXISTS {database} WITH (FORCE)"], capture_output=True)
            drop_redis_keys(args.redis, env["VERONICA_Q_NAME"])
        if args.keep:
            print(f"  ({mode} data and group logs kept in {data_dir})")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)


def drop_redis_keys(url: str, name: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    for key in client.scan_iter(match=f"*{name}*"):
        client.delete(key)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--modes", default="embedded,hosted")
    parser.add_argument("--groups", type=int, default=3, help="qcluster process groups (hosts)")
    parser.add_argument("--workers", type=int, default=2, help="q2 workers per group")
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--messages", type=int, default=120, help="task mails in the stream")
    parser.add_argument("--stream-seconds", type=float, default=60)
    parser.add_argument("--kill-every", type=float, default=4)
    parser.add_argument("--lease", type=int, default=10)
    parser.add_argument("--tick", type=int, default=2)
    parser.add_argument("--delay-ms", type=int, default=150, help="offline model latency per call")
    parser.add_argument("--drain-timeout", type=float, default=90)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/5")
    parser.add_argument("--skew", type=float, default=0, help="seconds the groups' wall clocks run ahead (< 0: behind)")
    parser.add_argument("--partition", type=float, default=0, help="hosted: seconds one more host is cut from PostgreSQL only")
    parser.add_argument("--partition-interval", type=float, default=0.5, help="seconds between mails during the cut")
    parser.add_argument("--keep", action="store_true", help="keep the embedded data folder and the groups' logs")
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        import logging

        logging.disable(logging.CRITICAL)
        print(json.dumps(child(args), default=str))
        return
    print(f"recovery under SIGKILL: {args.groups} qcluster groups x {args.workers} workers, {args.members} members, "
          f"{args.messages} messages over {args.stream_seconds:.0f}s, one group killed every {args.kill_every:.0f}s, "
          f"lease {args.lease}s, tick {args.tick}s, host clock skew {args.skew:+.0f}s\n")
    summary = {}
    for mode in args.modes.split(","):
        r = spawn(mode, args)
        summary[mode] = {key: r[key] for key in ("sent", "read", "lost", "unfinished", "duplicates", "overlaps", "stuck",
                                                 "killed_runs", "p50", "p99", "max", "lease", "load_start", "load")}
        summary[mode]["skew"] = args.skew
        if r.get("partition"):
            summary[mode]["partition"] = r["partition"]
        fmt = lambda v: "-" if v is None else f"{v:5.1f}s"  # noqa: E731
        print(f"[{mode}]  drained after {r['drained_after']:.0f}s, {r['runs']} runs, {r['kills']} kills")
        print(f"  messages sent {r['sent']}  read {r['read']}  lost {r['lost']}   tasks read but never finished {r['unfinished']}"
              f"  (reported failed by the worker {r['failed']}; producer writes failed by a deadlock {r['deadlocks']})")
        print(f"  answers {r['answers']}  duplicate answers {r['duplicates']}  overlapping runs {r['overlaps']}  stuck members {r['stuck']}")
        load = f"(load {r['load_start']:.1f} -> {r['load']:.1f} on {os.cpu_count()} CPUs)"
        print(f"  kill -> running again ({r['killed_runs']} killed runs of {r['expired_runs']} lease-expired)  p50 {fmt(r['p50'])}  p99 {fmt(r['p99'])}  "
              f"max {fmt(r['max'])}   (goal <= lease + 5 = {r['lease'] + 5}s)  {load}")
        print(f"    of which kill -> lease expired by the ticker  p50 {fmt(r['detect_p50'])}  max {fmt(r['detect_max'])};"
              f"  lease expired -> running again  p50 {fmt(r['pickup_p50'])}  p99 {fmt(r['pickup_p99'])}  {load}")
        for total, detect, pickup, wakes, refused, source, timeline in r["slowest"]:
            print(f"    slow: {total:5.1f}s = expiry {detect:5.1f}s + pickup {pickup:5.1f}s ({wakes} wakes received, {refused} unclaimed;"
                  f" the run came from a {source} wake)")
            print(f"          wakes after the expiry (written after their claim): {timeline or 'none'}")
        cut = r.get("partition")
        if cut:
            print(f"  partition: one host cut from PostgreSQL for {cut['seconds']:.0f}s, {cut['mails']} mails: wait p50 {fmt(cut['p50'])}"
                  f"  p99 {fmt(cut['p99'])}  max {fmt(cut['max'])}; wakes the cut host held on a timeout {cut['held_on_timeout']},"
                  f" handed back {cut['handed_back']}; mail of the last 3 s before the heal max {fmt(cut['before_heal_max'])}"
                  f"  (load {cut['load_start']:.1f} -> {cut['load']:.1f})")
        print()
    print(json.dumps(summary, default=str))  # the last line: the figures above, per mode


if __name__ == "__main__":
    main()
