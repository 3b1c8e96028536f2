"""Where a pooled worker's CPU goes per model call (issue 25 point 1), in one process, no q2.

One run pool (veronica.engine.fleet) in this process serves `--members` members x `--steps` calls
of the mock OpenAI vendor (its own process, `--latency` seconds a call); the wakes are handed to the
pool directly, as the q2 task does. Printed: CPU ms per model call of this process (the worker), of
the mock vendor and (hosted) of PostgreSQL's backends, and with --profile the functions that used the
worker's CPU (every thread profiled on its own CPU clock, time.thread_time, then merged; the
profiler's own overhead inflates the totals, not the shares).

Run inside a mode's environment (bench/_setup.isolated_env), e.g.
  .venv/bin/python bench/fleet_profile.py --mode embedded --members 100 --steps 5 [--profile]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._setup import REPO, isolated_env  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_of(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / TICK
        except OSError:
            pass
    return total


def child(args) -> dict:
    from bench._setup import django_setup

    django_setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from bench.fleet import Mock, setup_members

    members = setup_members(args.members, args.steps + 4)
    mock = Mock(args.latency, args.steps)  # in a session of its own: stopped on every way out
    try:
        return measure(args, members, mock)
    finally:
        mock.stop()


def measure(args, members: list, mock) -> dict:
    import cProfile
    import pstats

    from django.db import connection

    from bench.fleet import drained, mail_all, setup_members
    from veronica.engine import fleet, runner

    from django.conf import settings

    settings.OPENAI_BASE_URL = mock.root + "/v1"
    settings.RUNS_PER_WORKER = args.runs  # as a q2 worker's pool of this size has it (the SDK's connection limits)
    os.environ["OPENAI_API_KEY"] = "sk-fleet"
    hosted = connection.vendor == "postgresql"
    fleet.use_connection_pool()
    pool = fleet._pool = fleet.RunPool(args.runs)

    profiles: list = []

    def body(pk: int):
        """A wake as the q2 task hands it to the pool; with --profile, profiled on its thread's CPU clock
        (the pool's threads are started once and reused: each run gets a profiler of its own, merged)."""
        if not args.profile:
            return runner.claim_and_run(pool, pk, "message")
        prof = cProfile.Profile(time.thread_time)
        prof.enable()
        try:
            return runner.claim_and_run(pool, pk, "message")
        finally:
            prof.disable()
            profiles.append(prof)

    def backends() -> list[int]:
        if not hosted:
            return []
        with connection.cursor() as cursor:
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
            return [row[0] for row in cursor.fetchall()]

    # one warm-up round: imports, the SDK client, the connection pool
    warm = setup_members(2, args.steps + 4)
    mail_all(warm)
    for m in warm:
        pool.reserve()
        pool.start(lambda pk=m.pk: body(pk), name=f"wake-{m.pk}")
    while not drained(warm):
        time.sleep(0.2)
    profiles.clear()
    mail_all(members)
    served0 = mock.served()
    seen_pg: set[int] = set(backends())
    pg0 = cpu_of(list(seen_pg))
    mock0, me0, t0 = cpu_of([mock.proc.pid]), time.process_time(), time.monotonic()
    for m in members:
        pool.reserve()
        pool.start(lambda pk=m.pk: body(pk), name=f"wake-{m.pk}")
    while not drained(members) and time.monotonic() - t0 < 150:  # a run that never drains is reported, not waited on
        seen_pg |= set(backends())
        time.sleep(0.5)
    elapsed = time.monotonic() - t0
    me, mock_cpu, pg = time.process_time() - me0, cpu_of([mock.proc.pid]) - mock0, cpu_of(list(seen_pg)) - pg0
    calls = mock.served() - served0
    out = {"mode": "hosted" if hosted else "embedded", "members": args.members, "calls": calls, "elapsed": round(elapsed, 2),
           "ideal": args.steps * args.latency, "worker_ms_per_call": round(me * 1000 / calls, 2),
           "mock_ms_per_call": round(mock_cpu * 1000 / calls, 2), "postgres_ms_per_call": round(pg * 1000 / calls, 2),
           "load": os.getloadavg()[0], "profiled": args.profile}
    if args.profile:
        stats = None
        for prof in profiles:
            try:
                stats = pstats.Stats(prof) if stats is None else stats.add(prof)
            except TypeError:  # a thread that never ran a profiled call
                continue
        out_path = Path(args.profile_out)
        stats.dump_stats(out_path)
        out["profile"] = str(out_path)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", default="embedded")
    parser.add_argument("--members", type=int, default=100)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--latency", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=256, help="the run pool's size")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--profile-out", default="/tmp/fleet_profile.pstats")
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    if args.child:
        import logging

        logging.disable(logging.CRITICAL)
        print(json.dumps(child(args)))
        return
    with isolated_env(args.mode, "fprof") as env:
        forwarded = [a for a in sys.argv[1:]]
        proc = subprocess.run([sys.executable, __file__, "--child", *forwarded], cwd=REPO, env=env, capture_output=True,
                              text=True)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-4000:])
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(json.dumps(result))
    if args.profile:
        import pstats

        stats = pstats.Stats(result["profile"])
        stats.sort_stats("tottime").print_stats(40)
        stats.sort_stats("cumulative").print_stats(60)


if __name__ == "__main__":
    main()
