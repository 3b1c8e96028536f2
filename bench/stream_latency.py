"""Stream latency: from an event committed in a separate worker process to its arrival at N sockets.

    .venv/bin/python bench/stream_latency.py [--clients 1,10,50] [--events 100] [--rate 25] [--modes embedded,hosted]

For each mode it builds a throwaway database, starts a real daphne (veronica.asgi), connects N
WebSocket clients to one space, and runs a worker process that emits events at about `rate` per
second. The worker stamps each event's commit time (an on_commit hook registered before the event's
own doorbell); each client stamps the arrival. Same host, same clock. It also checks that every
client got every event exactly once, in order.

* embedded: SQLite in a temp VERONICA_DATA_DIR, in-memory channel layer; a worker's ring reaches
  the web process through the embedded doorbell (veronica.plumbing.doorbell), the consumer's poll is the backstop.
* hosted: PostgreSQL + channels-redis (the worker's ring crosses processes), on a uniquely named
  database and channel prefix that are dropped afterwards.

The last line printed is one JSON object {mode: {clients: {...}}}; bench/engine.py imports
measure_stream(mode, sockets).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
sys.path.insert(0, str(REPO))
from bench.wake_latency import Throwaway  # noqa: E402  (one throwaway database per measurement)

SETUP = """
import json, django
django.setup()
from django.contrib.auth.models import User
from veronica.swarm import access
from veronica.models import Space
space = Space.objects.filter(slug="bench-stream").first() or Space.objects.create(name="Bench stream", slug="bench-stream", workdir="/tmp")
user = User.objects.filter(username="bench-stream").first() or User.objects.create_user("bench-stream")
access.grant(space, user.username, "viewer", actor="bench")
_, key = access.create_token(user, "bench")
print(json.dumps({"space_id": space.pk, "key": key, "seq": Space.objects.get(pk=space.pk).event_seq}))
"""

WORKER = """
import json, random, sys, time
import django
django.setup()
from django.db import transaction
from veronica.swarm import events
space_id, count, rate = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
rng = random.Random(7)
for i in range(count + 1):  # event 0 warms up the worker's connections and is not measured
    stamp = {}
    with transaction.atomic():
        # registered before emit's own on_commit ring, so it runs first: the commit time
        transaction.on_commit(lambda: stamp.setdefault("t", time.time()))
        event = events.emit(space_id, "bench.tick", n=i)
        transaction.on_commit(lambda: stamp.setdefault("rung", time.time()))
    print(json.dumps({"seq": event.seq, "t": stamp["t"], "ring_ms": (stamp["rung"] - stamp["t"]) * 1000, "warmup": i == 0}), flush=True)
    time.sleep(rng.expovariate(rate))
"""

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_python(code: str, env: dict, *args: str) -> str:
    out = subprocess.run([PYTHON, "-c", code, *args], cwd=REPO, env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"subprocess failed:\n{out.stderr[-3000:]}")
    return out.stdout


class Daphne:
    def __init__(self, env: dict) -> None:
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="bench-daphne-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([PYTHON, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), "veronica.asgi:application"],
                                     cwd=REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/login/", timeout=1):
                    return
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.1)
        self.stop()
        raise SystemExit(f"daphne did not start:\n{Path(self.log.name).read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(8)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


async def measure(url: str, key: str, env: dict, space_id: int, clients: int, events: int, rate: float) -> dict:
    from websockets.asyncio.client import connect

    ws_url = url.replace("http://", "ws://") + "/ws/spaces/bench-stream/"
    headers = {"Authorization": f"Bearer {key}"}
    head = json.loads(run_python("import django;django.setup();from veronica.models import Space;"
                                 f"print(Space.objects.get(pk={space_id}).event_seq)", env))
    sockets = []
    for _ in range(clients):
        ws = await connect(ws_url + f"?after={head}", origin=url, additional_headers=headers, proxy=None, max_queue=None)
        while json.loads(await ws.recv())["type"] != "ready":
            pass
        sockets.append(ws)
    arrivals: list[dict[int, float]] = [dict() for _ in sockets]
    orders: list[list[int]] = [[] for _ in sockets]

    async def reader(i: int, ws) -> None:
        while len(orders[i]) < events + 1:
            msg = json.loads(await ws.recv())
            if msg.get("type") == "event" and msg["seq"] > head:
                arrivals[i][msg["seq"]] = time.time()
                orders[i].append(msg["seq"])

    readers = [asyncio.create_task(reader(i, ws)) for i, ws in enumerate(sockets)]
    worker = await asyncio.create_subprocess_exec(PYTHON, "-c", WORKER, str(space_id), str(events), str(rate), cwd=REPO, env=env,
                                                  stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await worker.communicate()
    if worker.returncode:
        raise SystemExit(f"worker failed:\n{err.decode()[-3000:]}")
    rows = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    expected = [row["seq"] for row in rows]
    committed = {row["seq"]: row["t"] for row in rows if not row["warmup"]}
    ring_ms = statistics.median(row["ring_ms"] for row in rows if not row["warmup"])
    try:
        await asyncio.wait_for(asyncio.gather(*readers), timeout=30)
    except asyncio.TimeoutError:
        pass
    for ws in sockets:
        await ws.close()
    latencies = [(arr[seq] - committed[seq]) * 1000 for arr in arrivals for seq in arr if seq in committed]
    exact = sum(1 for order in orders if order == expected)
    worst = sorted(((arr[s] - committed[s]) * 1000, s - head) for arr in arrivals for s in arr if s in committed)[-3:]
    if os.environ.get("BENCH_DEBUG"):
        rings = {row["seq"] - head: round(row["ring_ms"], 1) for row in rows}
        print("worst (ms, nth event, worker ring ms):", [(round(ms, 1), n, rings.get(n)) for ms, n in worst])
    latencies.sort()
    return {"clients": clients, "events": len(committed), "samples": len(latencies), "exact": exact,
            "p50": statistics.median(latencies), "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
            "max": latencies[-1], "ring_ms": ring_ms}


def measure_stream(mode: str, sockets: int, events: int = 100, rate: float = 25.0) -> dict:
    """One client count in one mode, on a throwaway database (and Redis prefixes), dropped after:
    p50_ms, p99_ms, max_ms, exact (clients that got every event once, in order), ring_ms."""
    with Throwaway(mode) as box:
        env = box.env()
        env["LOG_LEVEL"], env["PYTHONUNBUFFERED"] = "WARNING", "1"
        subprocess.run([PYTHON, "manage.py", "migrate", "--verbosity", "0"], cwd=REPO, env=env, check=True)
        info = json.loads(run_python(SETUP, env).strip().splitlines()[-1])
        web = Daphne(env)
        try:
            row = asyncio.run(measure(web.url, info["key"], env, info["space_id"], sockets, events, rate))
        finally:
            web.stop()
    return {"mode": mode, "sockets": sockets, "events": row["events"], "p50_ms": row["p50"], "p99_ms": row["p99"],
            "max_ms": row["max"], "exact": row["exact"], "ring_ms": row["ring_ms"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,10,50", help="comma-separated client counts")
    parser.add_argument("--events", type=int, default=100, help="events per client count")
    parser.add_argument("--rate", type=float, default=25.0, help="events per second from the worker (exponential gaps)")
    parser.add_argument("--modes", default="embedded,hosted")
    args = parser.parse_args()
    counts = [int(c) for c in args.clients.split(",") if c.strip()]
    print(f"{'mode':9} {'clients':>7} {'events':>7} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}")
    report: dict = {}
    for mode in args.modes.split(","):
        for n in counts:
            row = measure_stream(mode, n, args.events, args.rate)
            report.setdefault(mode, {})[str(n)] = {k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}
            print(f"{mode:9} {n:>7} {row['events']:>7} {row['p50_ms']:>9.1f} {row['p99_ms']:>9.1f} {row['max_ms']:>9.1f}"
                  f"   {row['exact']}/{n} clients got every event once, in order"
                  f" (worker's ring call {row['ring_ms']:.1f} ms)", flush=True)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
