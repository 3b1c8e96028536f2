"""Provider limits under a thundering herd: 50 members call one endpoint at once, the limit is 5
concurrent, and the mock vendor answers 429 (Retry-After: 1) to any request above 5 in flight.

    .venv/bin/python bench/provider_limits.py [--modes embedded,hosted] [--members 50] [--cap 5]
                                             [--latency 0.5] [--processes 5]

The members are spread over `--processes` worker processes (threads within each, as a worker running
many runs would), every one calling through get_provider() (the limiter and the vendor SDK wrapper
the agent loop uses) into the mock OpenAI vendor running in this process, which counts the requests
in flight. All start together; the figures:

* max_concurrent: the most requests the vendor saw in flight at once (goal: <= cap)
* member_429s: 429s that reached a member, as an error or as a retry inside its call (goal: 0)
* completion_ratio_to_ideal: the time until the last member had its answer, over the ideal schedule
  ceil(members / cap) x latency (goal: <= 1.2)

Embedded mode shares the limiter through SQLite, hosted mode through Redis (PostgreSQL as the
database). The last line printed is one JSON object, a key per mode.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._setup import REPO, isolated_env  # noqa: E402

GOALS = {"max_concurrent": "<= cap", "member_429s": "== 0", "completion_ratio_to_ideal": "<= 1.2"}


def child(members: int) -> None:
    """One worker process: `members` threads, each one model call, started by the parent's 'go'."""
    from bench._setup import django_setup

    django_setup()
    from django.db import close_old_connections

    from veronica.agent.providers import get_provider

    results: list[dict] = []
    lock = threading.Lock()
    go = threading.Event()

    def member(n: int) -> None:
        seen_429 = []
        provider = get_provider("openai:gpt-mock")

        def on_event(event: dict) -> None:
            if event.get("type") == "retry" and str(event.get("reason", "")).startswith("HTTP 429"):
                seen_429.append(event)

        go.wait()
        error = ""
        try:
            provider.complete("You are member %d." % n, [{"role": "user", "content": "hello"}], [],
                              should_stop=lambda: False, on_event=on_event)
        except Exception as exc:  # noqa: BLE001 - counted
            error = str(exc)
        finally:
            close_old_connections()
        with lock:
            results.append({"end": time.time(), "error": error, "retries_429": len(seen_429)})

    warm = get_provider("openai:gpt-mock")  # a long-lived worker has its SDK imported and its client pooled
    getattr(warm, "inner", warm).client
    threads = [threading.Thread(target=member, args=(n,)) for n in range(members)]
    for t in threads:
        t.start()
    print("ready", flush=True)
    sys.stdin.readline()
    go.set()
    for t in threads:
        t.join()
    print(json.dumps(results), flush=True)


def run_mode(mode: str, args) -> dict:
    from tests.vendors.mock_openai import MockOpenAI

    with isolated_env(mode, "limits") as env, MockOpenAI(api_key="sk-bench") as vendor:
        env.update(OPENAI_BASE_URL=vendor.base_url, OPENAI_API_KEY="sk-bench", VERONICA_MODEL_BACKOFF="0.2",
                   VERONICA_PROVIDER_LIMITS=json.dumps({"openai": {"concurrency": args.cap}}))
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=REPO, env=env, check=True)
        vendor.configure(latency=args.latency, capacity=args.cap, retry_after=1)
        share = [args.members // args.processes + (1 if i < args.members % args.processes else 0) for i in range(args.processes)]
        procs = [subprocess.Popen([sys.executable, __file__, "--child", str(n)], cwd=REPO, env=env, text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE) for n in share if n]
        for p in procs:
            assert p.stdout.readline().strip() == "ready", "a worker process failed to start"
        start = time.time()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in procs:
            results += json.loads(p.stdout.readline())
            p.wait(60)
        stats = vendor.stats()
        calls = [r for r in vendor.model_requests() if r.finished_at is not None]
    # The limiter's own share of the delay: how full it kept the cap while the herd lasted (1.0: a
    # slot never sat idle between one call's end and the next one's start).
    span = max(r.finished_at for r in calls) - min(r.started for r in calls)
    utilization = sum(r.finished_at - r.started for r in calls) / (args.cap * span)
    vendor_seconds = sum(r.finished_at - r.started for r in calls) / len(calls)
    ideal = math.ceil(args.members / args.cap) * args.latency
    elapsed = max(r["end"] for r in results) - start
    return {"members": len(results), "cap": args.cap, "max_concurrent": stats["max_in_flight"],
            "member_429s": sum(r["retries_429"] for r in results) + sum("429" in r["error"] for r in results),
            "errors": sum(bool(r["error"]) for r in results), "vendor_429s": stats["over_capacity"],
            "elapsed_s": round(elapsed, 3), "ideal_s": ideal, "completion_ratio_to_ideal": round(elapsed / ideal, 3),
            "limiter": "redis" if mode == "hosted" else "database (SQLite)", "processes": len(share),
            "cap_utilization": round(utilization, 3), "vendor_seconds_per_call": round(vendor_seconds, 3)}


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        return child(int(sys.argv[2]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="embedded,hosted")
    parser.add_argument("--members", type=int, default=50)
    parser.add_argument("--cap", type=int, default=5)
    parser.add_argument("--latency", type=float, default=0.5)
    parser.add_argument("--processes", type=int, default=5)
    args = parser.parse_args()
    out = {}
    for mode in args.modes.split(","):
        figures = run_mode(mode, args)
        out[mode] = figures
        print(f"{mode}: {figures['members']} members, cap {figures['cap']}, latency {args.latency}s, "
              f"{figures['processes']} processes, limiter {figures['limiter']}")
        for key, goal in GOALS.items():
            print(f"  {key:28} {figures[key]!s:>8}   goal {goal.replace('cap', str(figures['cap']))}")
        print(f"  elapsed {figures['elapsed_s']} s, ideal {figures['ideal_s']} s; errors {figures['errors']}, "
              f"429s the vendor sent {figures['vendor_429s']}")
        print(f"  cap utilization {figures['cap_utilization']} (the share of slot-time the vendor was busy), "
              f"{figures['vendor_seconds_per_call']} s per call at the vendor")
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")
    out["load_average"] = [round(x, 2) for x in load]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
