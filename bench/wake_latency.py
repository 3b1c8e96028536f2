"""Wake latency and orchestration overhead, embedded (SQLite) and hosted (PostgreSQL + Redis).

Per mode, in one child process with a throwaway database (a temp data dir, or a uniquely named
PostgreSQL database and django-q2 / channel prefixes on Redis, all dropped afterwards):

* wake: from a message's commit to its run starting (the Run row's started_at, on the database's
  clock) in a real django-q2 worker, next to a bare django-q2 no-op task (enqueue -> the worker
  starts it) in the same run. Samples are interleaved in random order with random gaps (0-250 ms),
  so neither side lines up with the broker's poll (the ORM broker polls every 100 ms); the ratio is
  what Veronica adds on top of the queue.
* step: the orchestration cost per agent step (zero-latency scripted model, one read_file tool,
  turn persisted, events emitted) next to LangGraph doing the same step (StateGraph + fake chat
  model + ToolNode) with the same durability: embedded against SqliteSaver at synchronous=NORMAL in
  WAL (Veronica's SQLite settings), hosted against PostgresSaver on the same PostgreSQL server.

    .venv/bin/python bench/wake_latency.py [--modes embedded,hosted] [--samples 40] [--steps 40]

The last line printed is one JSON object {"embedded": {...}, "hosted": {...}}. bench/engine.py
imports measure_wake(mode) and langgraph_step_ms(mode, steps).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PG_URL = "postgres://postgres@127.0.0.1:5432/{name}"
REDIS_BASE = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/5")


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


# --- throwaway resources ---------------------------------------------------------------------------

def psql(sql: str) -> None:
    subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-qc", sql], check=True, capture_output=True)


def unique(prefix: str) -> str:
    return f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:6]}"


class Throwaway:
    """A database (and for hosted mode, Redis prefixes) of our own; everything dropped on exit."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.data_dir = tempfile.mkdtemp(prefix=f"bench-wake-{mode}-")
        self.q_name = unique("bench-wake")
        self.pg_db = unique("bench_wake") if mode == "hosted" else ""

    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "VERONICA_SQLITE_PATH")}
        env.update(DJANGO_SETTINGS_MODULE="veronica.settings", VERONICA_DATA_DIR=self.data_dir, VERONICA_Q_NAME=self.q_name,
                   LOG_LEVEL="WARNING", PYTHONPATH=str(REPO))
        if self.mode == "hosted":
            env.update(DATABASE_URL=PG_URL.format(name=self.pg_db), REDIS_URL=REDIS_BASE, VERONICA_CHANNEL_PREFIX=self.q_name)
        return env

    def __enter__(self) -> "Throwaway":
        if self.pg_db:
            psql(f"CREATE DATABASE {self.pg_db}")
        return self

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.data_dir, ignore_errors=True)
        if self.pg_db:
            psql(f"DROP DATABASE IF EXISTS {self.pg_db} WITH (FORCE)")
            import redis

            client = redis.Redis.from_url(REDIS_BASE)
            for pattern in (f"*{self.q_name}*",):
                keys = list(client.scan_iter(pattern, count=1000))
                if keys:
                    client.delete(*keys)


def run_child(mode: str, *args: str) -> dict:
    with Throwaway(mode) as box:
        proc = subprocess.run([sys.executable, __file__, "--child", mode, *args], cwd=REPO, env=box.env(),
                              capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{mode} run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- the child: runs inside the throwaway database ---------------------------------------------------

def setup_world():
    sys.path.insert(0, str(REPO))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from veronica.engine import supervisor
    from veronica.models import Role, Space

    workdir = Path(tempfile.mkdtemp(prefix="bench-wake-work-"))
    for i in range(5):
        (workdir / f"file{i}.txt").write_text("x" * 200)
    space = Space.objects.create(name="bench", slug="bench", workdir=str(workdir))
    supervisor.add_member(space, "lead", role=Role.LEADER, actor="bench")
    worker = supervisor.add_member(space, "w", actor="bench")
    return space, worker


def bare_sample() -> float:
    from django_q.tasks import async_task, result

    t0 = time.time()
    task_id = async_task("bench.probe.now")
    started = result(task_id, wait=20_000)
    if started is None:
        raise RuntimeError("the bare task never ran")
    return started - t0


def wake_sample(space, worker, i: int) -> float:
    from django.db import transaction

    from veronica.swarm import bus
    from veronica.models import Member, Run

    before = Run.objects.filter(member=worker).order_by("-id").values_list("id", flat=True).first() or 0
    stamp: dict = {}
    with transaction.atomic():
        transaction.on_commit(lambda: stamp.setdefault("t", time.time()))  # registered first: runs first, at the commit
        bus.send(space, "lead", "w", f"ping {i}")
    deadline = time.monotonic() + 20
    run = None
    # Polled every 10 ms, as django-q2's result() polls for the bare task: the figure is the Run row's
    # own timestamp, so the poll only adds load, and a 1 ms poll loaded this side alone (2 cores).
    while run is None and time.monotonic() < deadline:
        run = Run.objects.filter(member=worker, id__gt=before).order_by("id").first()
        if run is None:
            time.sleep(0.01)
    if run is None:
        raise RuntimeError("the message never started a run")
    while Member.objects.filter(pk=worker.pk).exclude(lease_token="").exists() and time.monotonic() < deadline:
        time.sleep(0.01)  # the next sample starts from an idle member
    return run.started_at.timestamp() - stamp["t"]


def child_wake(samples: int) -> dict:
    space, worker = setup_world()
    from tests.harness import qcluster
    from veronica.models import Wake

    rng = random.Random(13)
    bare, wake = [], []
    with qcluster(workers=4):
        time.sleep(1)
        bare_sample(), wake_sample(space, worker, -1)  # warm both paths up; not measured
        Wake.objects.all().delete()
        for i in range(samples):
            order = [0, 1]
            rng.shuffle(order)
            for which in order:
                time.sleep(rng.uniform(0, 0.25))
                if which == 0:
                    bare.append(bare_sample())
                else:
                    wake.append(wake_sample(space, worker, i))
        wakes = Wake.objects.filter(member=worker).count()
        burst = burst_phase(space, rng)
    p50, bare_p50 = statistics.median(wake) * 1000, statistics.median(bare) * 1000
    return {"samples": samples, "p50_ms": p50, "p99_ms": pct(wake, 99) * 1000, "bare_p50_ms": bare_p50,
            "bare_p99_ms": pct(bare, 99) * 1000, "p50_ratio": p50 / bare_p50, "wakes_per_message": wakes / samples, **burst}


BURST = 40


def burst_phase(space, rng) -> dict:
    """Mail that arrives while runs are in flight: BURST messages to one member at random 0-40 ms
    gaps (the offline model at zero latency), then until its mailbox is drained. Wakes per message
    (every wake task a worker ran for it, claimed or not) and the share of claimed runs that made no
    model call."""
    from veronica.swarm import bus
    from veronica.engine import supervisor
    from veronica.models import Member, Message, Run, Wake

    member = supervisor.add_member(space, "burst", actor="bench")
    for i in range(BURST):
        bus.send(space, "lead", "burst", f"job {i}")
        time.sleep(rng.uniform(0, 0.04))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (Message.objects.filter(recipient=member, read_at__isnull=True).exists()
                                           or Member.objects.filter(pk=member.pk).exclude(lease_token="").exists()):
        time.sleep(0.02)
    time.sleep(1.0)  # wakes still in the queue land
    runs = list(Run.objects.filter(member=member).values_list("model_calls", flat=True))
    wakes = Wake.objects.filter(member=member).count()
    return {"burst_messages": BURST, "burst_wakes_per_message": wakes / BURST, "burst_runs": len(runs),
            "burst_runs_without_model_call": sum(1 for c in runs if not c) / max(len(runs), 1)}


def child_step(steps: int) -> dict:
    space, worker = setup_world()
    return {"veronica_step_ms": veronica_step(space, worker, steps)}


def veronica_step(space, worker, steps: int) -> float:
    """In-process: one run of `steps` tool steps with a zero-latency scripted policy."""
    import veronica.agent.loop as loop
    from veronica.swarm import bus
    from veronica.agent.providers.base import Reply, ToolCall, Usage
    from veronica.engine import runner, supervisor
    from veronica.models import Member

    class Policy:
        n = 0

        def complete(self, system, messages, tools, *, should_stop, on_event=None):
            self.n += 1
            if self.n > steps:
                return Reply(text="done", usage=Usage(input=10, output=2))
            return Reply(tool_calls=[ToolCall(id=f"c{self.n}", name="read_file", args={"path": f"file{self.n % 5}.txt"})],
                         usage=Usage(input=10, output=2))

    loop.get_provider = lambda spec: Policy()
    Member.objects.filter(pk=worker.pk).update(max_iterations=steps + 5)
    timings = []
    for _ in range(3):
        bus.send(space, "lead", "w", "go")
        t0 = time.perf_counter()
        runner.wake(worker.pk, "message")
        timings.append((time.perf_counter() - t0) / steps * 1000)
        supervisor.clear_session(Member.objects.get(pk=worker.pk), actor="bench")
    return statistics.median(timings)


# --- LangGraph, same step, same durability ----------------------------------------------------------

def langgraph_step_ms(mode: str, steps: int = 40) -> float | None:
    """LangGraph's per-step cost: SqliteSaver at synchronous=NORMAL (embedded), PostgresSaver on a
    throwaway database of the same server (hosted). None when LangGraph is not installed."""
    try:
        from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
        from langchain_core.messages import AIMessage, HumanMessage
        from langchain_core.tools import tool
        from langgraph.graph import StateGraph, START, MessagesState
        from langgraph.prebuilt import ToolNode, tools_condition
    except ImportError:
        return None
    workdir = Path(tempfile.mkdtemp(prefix="bench-lg-"))
    for i in range(5):
        (workdir / f"file{i}.txt").write_text("x" * 200)

    @tool
    def read_file(path: str) -> str:
        """Read a file of the workspace."""
        return (workdir / path).read_text()

    def build(checkpointer):
        replies = [AIMessage(content="", tool_calls=[{"name": "read_file", "args": {"path": f"file{i % 5}.txt"}, "id": f"c{i}"}])
                   for i in range(1, steps + 1)] + [AIMessage(content="done")]
        model = FakeMessagesListChatModel(responses=replies)

        def agent(state: MessagesState):
            return {"messages": [model.invoke(state["messages"])]}

        graph = StateGraph(MessagesState)
        graph.add_node("agent", agent)
        graph.add_node("tools", ToolNode([read_file]))
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", tools_condition)
        graph.add_edge("tools", "agent")
        return graph.compile(checkpointer=checkpointer)

    def timed(checkpointer) -> float:
        app = build(checkpointer)
        t0 = time.perf_counter()
        app.invoke({"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": steps * 3})
        return (time.perf_counter() - t0) / steps * 1000

    try:
        if mode == "hosted":
            from langgraph.checkpoint.postgres import PostgresSaver

            name = unique("bench_lg")
            psql(f"CREATE DATABASE {name}")
            try:
                with PostgresSaver.from_conn_string(PG_URL.format(name=name)) as saver:
                    saver.setup()
                    return statistics.median(timed(saver) for _ in range(3))
            finally:
                psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        import sqlite3

        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(str(workdir / "ckpt.sqlite"), check_same_thread=False)
        saver = SqliteSaver(conn)
        saver.setup()  # WAL
        conn.execute("PRAGMA synchronous=NORMAL")  # as Veronica's SQLite (LangGraph's default is FULL)
        try:
            return statistics.median(timed(saver) for _ in range(3))
        finally:
            conn.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# --- the entry points --------------------------------------------------------------------------------

def measure_wake(mode: str, samples: int = 40) -> dict:
    """Commit -> run start vs a bare django-q2 task, same run: p50_ms, p99_ms, bare_p50_ms,
    bare_p99_ms, p50_ratio, wakes_per_message."""
    return run_child(mode, "--what", "wake", "--samples", str(samples))


def measure_step(mode: str, steps: int = 40) -> dict:
    """Veronica's per-step cost and LangGraph's with the same durability, same run."""
    out = run_child(mode, "--what", "step", "--steps", str(steps))
    lg = langgraph_step_ms(mode, steps)
    out["langgraph_step_ms"] = lg
    out["langgraph_step_ratio"] = out["veronica_step_ms"] / lg if lg else None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--modes", default="embedded,hosted")
    parser.add_argument("--no-step", action="store_true", help="wake latency only")
    parser.add_argument("--child")
    parser.add_argument("--what", default="wake")
    args = parser.parse_args()
    if args.child:
        import logging

        logging.disable(logging.CRITICAL)
        result = child_wake(args.samples) if args.what == "wake" else child_step(args.steps)
        print(json.dumps(result))
        return
    print(f"wake latency ({args.samples} interleaved samples) and step overhead ({args.steps}-step runs)\n")
    report: dict = {}
    for mode in args.modes.split(","):
        r = measure_wake(mode, args.samples)
        print(f"[{mode}]")
        print(f"  bare django-q2 no-op      p50 {r['bare_p50_ms']:7.1f} ms   p99 {r['bare_p99_ms']:7.1f} ms")
        print(f"  message -> run started    p50 {r['p50_ms']:7.1f} ms   p99 {r['p99_ms']:7.1f} ms   ratio p50 {r['p50_ratio']:.2f}x"
              f"   {r['wakes_per_message']:.2f} wakes per message")
        print(f"  burst of {r['burst_messages']} during runs      {r['burst_wakes_per_message']:.2f} wakes per message, {r['burst_runs']} runs,"
              f" {r['burst_runs_without_model_call']:.0%} of them without a model call")
        if not args.no_step:
            s = measure_step(mode, args.steps)
            r.update(s)
            saver = "PostgresSaver" if mode == "hosted" else "SqliteSaver, synchronous=NORMAL"
            line = f"  per agent step (offline)  {s['veronica_step_ms']:7.2f} ms"
            if s["langgraph_step_ms"]:
                line += f"   LangGraph ({saver}) {s['langgraph_step_ms']:6.2f} ms   ratio {s['langgraph_step_ratio']:.2f}x"
            print(line)
        print()
        report[mode] = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
