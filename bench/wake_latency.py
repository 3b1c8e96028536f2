"""Wake latency and orchestration overhead, embedded (SQLite) and hosted (PostgreSQL + Redis).

Prints, per mode:
* p50 / p99 from a message committed to its run starting in a real django-q2 worker, next to the
  bare django-q2 dispatch latency (enqueue -> task starts) measured in the same run: the ratio is
  what Veronica adds on top of the queue;
* the orchestration overhead per agent step (model call with a zero-latency policy, turn persisted,
  events emitted, one tool run), next to LangGraph doing the same step (StateGraph + fake chat
  model + ToolNode + SqliteSaver checkpointer) in the same run.

Usage: .venv/bin/pip install -r requirements-bench.txt; .venv/bin/python bench/wake_latency.py [--samples N]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PG_DB = "bench_wake"


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def child(mode: str, samples: int, steps: int) -> dict:
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "veronica.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django.db.models import Sum  # noqa: F401
    from django_q.tasks import async_task, result

    from tests.harness import qcluster
    from veronica import bus
    from veronica.engine import supervisor
    from veronica.models import Member, Role, Run, Space

    workdir = Path(tempfile.mkdtemp())
    for i in range(5):
        (workdir / f"file{i}.txt").write_text("x" * 200)
    Space.objects.filter(slug="bench").delete()
    space = Space.objects.create(name="bench", slug="bench", workdir=str(workdir))
    supervisor.add_member(space, "lead", role=Role.LEADER, actor="bench")
    worker = supervisor.add_member(space, "w", actor="bench")

    out: dict = {"mode": mode}
    with qcluster(workers=4):
        time.sleep(1)
        # bare q2 dispatch
        bare = []
        for _ in range(samples):
            t0 = time.time()
            task_id = async_task("bench.probe.now")
            started = None
            while started is None:
                started = result(task_id, wait=20)
            bare.append(started - t0)
        # message committed -> run started
        wake = []
        for i in range(samples):
            before = Run.objects.filter(member=worker).count()
            t0 = time.time()
            bus.send(space, "lead", "w", f"ping {i}")
            while True:
                run = Run.objects.filter(member=worker).order_by("-id").first()
                if run and Run.objects.filter(member=worker).count() > before:
                    break
                time.sleep(0.002)
            wake.append(run.started_at.timestamp() - t0)
            while Member.objects.filter(pk=worker.pk).exclude(lease_token="").exists():
                time.sleep(0.005)
    out["bare_p50"], out["bare_p99"] = pct(bare, 50), pct(bare, 99)
    out["wake_p50"], out["wake_p99"] = pct(wake, 50), pct(wake, 99)
    out["veronica_step_ms"] = veronica_step(space, worker, steps)
    return out


def veronica_step(space, worker, steps: int) -> float:
    """In-process: one run of `steps` tool steps with a zero-latency scripted policy."""
    import veronica.agent.loop as loop
    from veronica import bus
    from veronica.agent.providers.base import Reply, ToolCall, Usage
    from veronica.engine import runner
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
        from veronica.engine import supervisor

        supervisor.clear_session(Member.objects.get(pk=worker.pk), actor="bench")
    return statistics.median(timings)


def langgraph_step(steps: int) -> float | None:
    try:
        from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
        from langchain_core.messages import AIMessage, HumanMessage
        from langchain_core.tools import tool
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.graph import END, START, MessagesState, StateGraph
        from langgraph.prebuilt import ToolNode, tools_condition
    except ImportError:
        return None
    import sqlite3

    workdir = Path(tempfile.mkdtemp())
    for i in range(5):
        (workdir / f"file{i}.txt").write_text("x" * 200)

    @tool
    def read_file(path: str) -> str:
        """Read a file of the workspace."""
        return (workdir / path).read_text()

    def run_once() -> float:
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
        conn = sqlite3.connect(str(workdir / "ckpt.sqlite"), check_same_thread=False)
        app = graph.compile(checkpointer=SqliteSaver(conn))
        t0 = time.perf_counter()
        app.invoke({"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": str(time.time())}, "recursion_limit": steps * 3})
        return (time.perf_counter() - t0) / steps * 1000

    return statistics.median(run_once() for _ in range(3))


def spawn(mode: str, samples: int, steps: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env["VERONICA_DATA_DIR"] = tempfile.mkdtemp(prefix=f"bench-{mode}-")
    env["VERONICA_Q_NAME"] = f"bench-{mode}-{os.getpid()}"
    if mode == "hosted":
        subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc", f"DROP DATABASE IF EXISTS {PG_DB}"], check=False,
                       capture_output=True)
        subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc", f"CREATE DATABASE {PG_DB}"], check=True, capture_output=True)
        env["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{PG_DB}"
        env["REDIS_URL"] = "redis://127.0.0.1:6379/5"
    proc = subprocess.run([sys.executable, __file__, "--child", mode, "--samples", str(samples), "--steps", str(steps)],
                          cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{mode} run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--child")
    parser.add_argument("--modes", default="embedded,hosted")
    args = parser.parse_args()
    if args.child:
        import logging

        logging.disable(logging.CRITICAL)
        print(json.dumps(child(args.child, args.samples, args.steps)))
        return
    lg = langgraph_step(args.steps)
    print(f"wake latency and step overhead ({args.samples} wakes, {args.steps}-step runs)\n")
    for mode in args.modes.split(","):
        r = spawn(mode, args.samples, args.steps)
        print(f"[{mode}]")
        print(f"  bare django-q2 dispatch   p50 {r['bare_p50'] * 1000:7.1f} ms   p99 {r['bare_p99'] * 1000:7.1f} ms")
        print(f"  message -> run started    p50 {r['wake_p50'] * 1000:7.1f} ms   p99 {r['wake_p99'] * 1000:7.1f} ms"
              f"   ratio p50 {r['wake_p50'] / r['bare_p50']:.2f}x  p99 {r['wake_p99'] / r['bare_p99']:.2f}x")
        line = f"  per agent step (offline)  {r['veronica_step_ms']:7.2f} ms"
        if lg is not None:
            line += f"   LangGraph (SqliteSaver) {lg:6.2f} ms   ratio {r['veronica_step_ms'] / lg:.2f}x"
        else:
            line += "   (LangGraph baseline not installed: pip install -r requirements-bench.txt)"
        print(line + "\n")


if __name__ == "__main__":
    main()
