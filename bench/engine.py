"""The engine's step cost, both modes, against the limits measured in the same run.

    .venv/bin/python bench/engine.py [--modes embedded,hosted] [--reps 3]

Per mode, in a child process on a throwaway database (unique PostgreSQL database and Redis prefix,
dropped afterwards; SQLite in a temp dir):

* commit_per_s: the raw commit rate of the database (one-row INSERT, autocommit): the limit;
* cpu_ms_per_step, sql_per_step, commits_per_step, step_ms: one step in-process with a zero-latency
  scripted model (read_file each step), from one model call to the next, median over a 10-step run
  (sql_per_call_whole_run: the run's statements over its 11 model calls, start and end included);
* step_ms_50_turns / 1000 / 3000: the same on a transcript that already holds that many turns, the three
  measured round-robin; step_ratio_3000_to_50_turns: the median of the rounds' 3000 / 50 ratios;
* steps_per_s_5 / 20 / 50: a real django-q2 cluster (4 workers) with N busy members in ONE space, the
  offline model at zero latency, each with far more assigned work than the window: model calls per
  second over 2 s windows; steps_per_s_50_in_10_spaces: the same 50 members spread over 10 spaces;
* wake_p50_ratio, wake_p99_ms: message committed -> run started, vs a bare django-q2 no-op task in the
  same run (bench.wake_latency.measure_wake when it exists, else the adapter below);
* stream_p99_ms_1 / _50: event committed in a worker -> arrival at 1 / 50 sockets (bench.stream_latency);
* langgraph_step_ratio: Veronica's step / LangGraph's (also call to call) for the same fake model and
  tool on the same database and durability, each LangGraph run paired with a Veronica run next to it,
  in alternating order (the median of 2 x reps + 1 pairs' ratios; langgraph_paired_ms gives both sides' medians) (SqliteSaver at synchronous=NORMAL embedded, PostgresSaver
  hosted). The ratio uses LangGraph at durability="sync" (langgraph_step_ms): each step's checkpoint is
  written before the next step starts, as Veronica commits a step before its next model call. LangGraph
  1.x's `invoke` defaults to durability="async" (the checkpoint is written in a background thread while
  the next step runs: a crash can lose the last step); that figure is printed too, as
  langgraph_async_step_ms, and is not what the ratio compares with.

Every figure is the median of `--reps` repetitions. The last line is one JSON object
{"embedded": {...}, "hosted": {...}}.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._inproc import STEPS, Counter, make_space, one_run, scripted_provider  # noqa: E402,F401
from bench._setup import REPO, django_setup, isolated_env, pct  # noqa: E402

ASSIGNMENTS = 100  # per busy member, six files each (a file read once is not read again): ~700 model calls
FILES = 6 * ASSIGNMENTS


def median_of(reps: int, fn) -> float:
    return statistics.median(fn() for _ in range(reps))


# --- the limit: raw commits -------------------------------------------------------------------

def commit_rate(seconds: float = 1.0) -> float:
    from django.db import connection

    with connection.cursor() as cur:
        key = "BIGSERIAL PRIMARY KEY" if connection.vendor == "postgresql" else "INTEGER PRIMARY KEY"
        cur.execute(f"CREATE TABLE IF NOT EXISTS bench_commit (id {key}, v INTEGER)")
    n, t0 = 0, time.perf_counter()
    with connection.cursor() as cur:
        while time.perf_counter() - t0 < seconds:
            cur.execute("INSERT INTO bench_commit (v) VALUES (%s)", [n])  # autocommit: one commit each
            n += 1
    return n / (time.perf_counter() - t0)


# --- in-process runs with a scripted zero-latency model ------------------------------------------

def seed_transcript(member, turns: int) -> None:
    from veronica.agent import transcript
    from veronica.models import Turn, TurnRole

    session = transcript.open_session(member)
    rows = []
    for i in range(turns):
        k, seq = i % 3, i + 1
        if k == 0:
            rows.append(Turn(session=session, seq=seq, role=TurnRole.USER, content=f"earlier brief {i}: carry on"))
        elif k == 1:
            rows.append(Turn(session=session, seq=seq, role=TurnRole.ASSISTANT, content="",
                             tool_calls=[{"id": f"old{i}", "name": "read_file", "args": {"path": "f1.txt"}}]))
        else:
            rows.append(Turn(session=session, seq=seq, role=TurnRole.TOOL, content="1  some earlier file line of text",
                             tool_call_id=f"old{i - 1}", tool_name="read_file"))
    if rows and rows[-1].role == TurnRole.ASSISTANT:
        rows.pop()
    Turn.objects.bulk_create(rows, batch_size=500)


def step_profile(workdir: Path, reps: int) -> dict:
    space, (worker,) = make_space("profile", 1, workdir)
    one_run(space, worker)  # warm-up: connections, imports, the session
    runs = [one_run(space, worker) for _ in range(reps)]
    out = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    # The three transcript lengths are measured round-robin (2 x reps + 1 rounds), so a host whose speed
    # drifts over the seconds this takes favours none of them; the ratio is the median of the rounds'.
    members = {}
    for turns in (50, 1000, 3000):
        space, (member,) = make_space(f"growth-{turns}", 1, workdir)
        seed_transcript(member, turns)
        one_run(space, member, 2)
        members[turns] = (space, member)
    rounds = []
    for k in range(2 * reps + 1):  # the order alternates too: whatever runs first in a round favours neither
        order = list(members) if k % 2 == 0 else list(reversed(members))
        rounds.append({turns: one_run(*members[turns])["step_ms"] for turns in order})
    out["growth"] = {turns: statistics.median(r[turns] for r in rounds) for turns in members}
    out["growth_ratio"] = statistics.median(r[3000] / r[50] for r in rounds)
    return out


# --- the real cluster: N busy members in one space --------------------------------------------------

def assign(space, members) -> None:
    from veronica.models import Message

    rows = []
    for m in members:
        for k in range(ASSIGNMENTS):
            files = " ".join(f"f{k * 6 + j}.txt" for j in range(6))
            rows.append(Message(space=space, sender_name="lead", recipient=m, recipient_name=m.name, subject=f"task {k}",
                                body=f"You are assigned task #{900000 + k}: read {files}"))
    Message.objects.bulk_create(rows, batch_size=500)


def assistant_turns(spaces) -> int:
    from veronica.models import Turn, TurnRole

    return Turn.objects.filter(session__member__space__in=spaces, role=TurnRole.ASSISTANT).count()


def wait_idle(spaces, timeout: float = 60) -> None:
    from veronica.models import Member

    deadline = time.monotonic() + timeout
    while Member.objects.filter(space__in=spaces).exclude(lease_token="").exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def throughput(n: int, workdir: Path, reps: int, window: float = 2.0, spaces: int = 1) -> float:
    """Model calls per second with n busy members, in one space or spread over `spaces` spaces."""
    from veronica.engine import supervisor
    from veronica.engine.wakes import enqueue_wake

    made, members = [], []
    for k in range(spaces):
        space, some = make_space(f"busy-{n}-{spaces}-{k}", n // spaces, workdir)
        assign(space, some)
        made.append(space)
        members += some
    for m in members:
        enqueue_wake(m.pk, "message")
    deadline = time.monotonic() + 30
    while assistant_turns(made) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # every worker busy
    rates = []
    for _ in range(reps):
        c0, t0 = assistant_turns(made), time.perf_counter()
        time.sleep(window)
        c1, t1 = assistant_turns(made), time.perf_counter()
        rates.append((c1 - c0) / (t1 - t0))
    for space in made:
        supervisor.halt_all(space, actor="bench")
    wait_idle(made)
    return statistics.median(rates)


# --- wake and stream: iss13b's measuring functions, or adapters on the existing code -----------------

def wake_adapter(mode: str, workdir: Path, samples: int = 25) -> dict:
    """bench.wake_latency has no measure_wake(mode) yet: the same measurement on the running cluster,
    with random gaps so neither loop aligns with a broker's poll."""
    from django_q.tasks import async_task, result

    from veronica.swarm import bus
    from veronica.models import Member, Run

    space, (worker,) = make_space("wake", 1, workdir)
    rng = random.Random(13)
    bare, wake = [], []
    for i in range(samples):
        time.sleep(rng.uniform(0.0, 0.12))
        t0 = time.time()
        task_id = async_task("bench.probe.now")
        started = None
        while started is None:
            started = result(task_id, wait=20)
        bare.append(started - t0)
        time.sleep(rng.uniform(0.0, 0.12))
        before = Run.objects.filter(member=worker).count()
        t0 = time.time()
        bus.send(space, "lead", worker.name, f"ping {i}")
        deadline = time.monotonic() + 20
        while Run.objects.filter(member=worker).count() <= before and time.monotonic() < deadline:
            time.sleep(0.002)
        run = Run.objects.filter(member=worker).order_by("-id").first()
        wake.append(run.started_at.timestamp() - t0)
        while Member.objects.filter(pk=worker.pk).exclude(lease_token="").exists():
            time.sleep(0.005)
    return {"p50_ratio": pct(wake, 50) / pct(bare, 50), "p99_ms": pct(wake, 99) * 1000,
            "p50_ms": pct(wake, 50) * 1000, "bare_p50_ms": pct(bare, 50) * 1000}


def measure_wake(mode: str, workdir: Path) -> dict:
    try:
        from bench.wake_latency import measure_wake as theirs
    except ImportError:
        return wake_adapter(mode, workdir)
    return theirs(mode)


def stream_adapter(mode: str, sockets: list[int], reps: int) -> dict[int, dict]:
    """bench.stream_latency has no measure_stream(mode, sockets) yet: its daphne and its measure(),
    one daphne for every socket count."""
    import asyncio

    from bench import stream_latency as sl

    env = dict(os.environ)
    info = json.loads(sl.run_python(sl.SETUP, env).strip().splitlines()[-1])
    web = sl.Daphne(env)
    out = {}
    try:
        for n in sockets:
            rows = [asyncio.run(sl.measure(web.url, info["key"], env, info["space_id"], n, 25, 25.0)) for _ in range(reps)]
            out[n] = {"p99_ms": statistics.median(r["p99"] for r in rows), "p50_ms": statistics.median(r["p50"] for r in rows)}
    finally:
        web.stop()
    return out


def measure_stream(mode: str, sockets: list[int], reps: int) -> dict[int, dict]:
    try:
        from bench.stream_latency import measure_stream as theirs
    except ImportError:
        return stream_adapter(mode, sockets, reps)
    return {n: theirs(mode, n) for n in sockets}


# --- LangGraph, the fair baseline ---------------------------------------------------------------------

def langgraph_step(mode: str, workdir: Path, reps: int, veronica=None) -> dict[str, float]:
    """LangGraph's step (ms) at durability "sync" (the fair one) and "async" (its default). veronica: a
    function returning Veronica's step (ms) on a 10-step run: each LangGraph run is then paired with one
    of Veronica's next to it, and "ratio" is the median of the pairs' ratios, so that a host whose
    speed drifts over the minutes of the bench (a shared VM) does not favour the one measured when it
    was fast. The pairs alternate the order (V LG, LG V, ...): on PostgreSQL a run that follows
    LangGraph's checkpoint writes waits behind their flush (a Veronica step measured 5-7 ms before
    the saver's first runs and 10-15 ms right after them), which a fixed order charged to one side."""
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import tool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    @tool
    def read_file(path: str) -> str:
        """Read a file of the workspace."""
        return (workdir / path).read_text()

    def graph(steps: int):
        g = StateGraph(MessagesState)
        model = FakeMessagesListChatModel(responses=[
            AIMessage(content="", tool_calls=[{"name": "read_file", "args": {"path": f"f{i % 5}.txt"}, "id": f"c{i}"}])
            for i in range(1, steps + 1)] + [AIMessage(content="done")])
        def agent(state):
            marks.append(time.perf_counter())
            return {"messages": [model.invoke(state["messages"])]}
        g.add_node("agent", agent)
        g.add_node("tools", ToolNode([read_file]))
        g.add_edge(START, "agent")
        g.add_conditional_edges("agent", tools_condition)
        g.add_edge("tools", "agent")
        return g

    marks: list[float] = []

    def timed(saver, durability: str = "sync") -> float:
        """Like Veronica's figure: from one model call to the next, median over the run."""
        marks.clear()
        app = graph(STEPS).compile(checkpointer=saver)
        app.invoke({"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": str(time.time_ns())},
                                                         "recursion_limit": STEPS * 3}, durability=durability)
        return statistics.median(b - a for a, b in zip(marks, marks[1:])) * 1000

    def both(saver) -> dict[str, float]:
        timed(saver)
        out = {"sync": median_of(reps, lambda: timed(saver, "sync")), "async": median_of(reps, lambda: timed(saver, "async"))}
        if veronica is not None:
            pairs = []
            for i in range(2 * reps + 1):  # in alternating order: each side follows the other half the time
                if i % 2 == 0:
                    v = veronica()
                    pairs.append((v, timed(saver, "sync")))
                else:
                    lg = timed(saver, "sync")
                    pairs.append((veronica(), lg))
            out["ratio"] = statistics.median(v / lg for v, lg in pairs)
            out["paired_veronica"] = statistics.median(v for v, _ in pairs)
            out["paired_sync"] = statistics.median(lg for _, lg in pairs)
        return out

    if mode == "hosted":
        from langgraph.checkpoint.postgres import PostgresSaver

        with PostgresSaver.from_conn_string(os.environ["DATABASE_URL"]) as saver:
            saver.setup()
            return both(saver)
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(str(workdir / "langgraph.sqlite3"), check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")  # Veronica's durability, not FULL
    saver = SqliteSaver(conn)
    return both(saver)


# --- one mode, in its own process ----------------------------------------------------------------------

def child(mode: str, reps: int) -> dict:
    import logging

    django_setup()
    logging.disable(logging.CRITICAL)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from tests.harness import qcluster

    workdir = Path(tempfile.mkdtemp(prefix="bench-engine-work-"))
    for i in range(FILES):
        (workdir / f"f{i}.txt").write_text("".join(f"line {j} of file {i}\n" for j in range(20)))
    (workdir / "README.md").write_text("# bench\n")
    (workdir / "docs").mkdir()
    (workdir / "docs" / "design.md").write_text("# design\n")
    clock = time.monotonic()
    timings = {}

    def lap(name: str) -> None:
        nonlocal clock
        timings[name] = round(time.monotonic() - clock, 1)
        clock = time.monotonic()

    out: dict = {"commit_per_s": round(median_of(reps, commit_rate))}
    lap("commit")
    profile = step_profile(workdir, reps)
    lap("profile")
    out.update(cpu_ms_per_step=round(profile["cpu_ms"], 2), sql_per_step=round(profile["sql"], 1),
               commits_per_step=round(profile["commits"], 2), step_ms=round(profile["step_ms"], 2),
               sql_per_call_whole_run=round(profile["whole_run_sql_per_call"], 1), sql_per_10_step_run=profile["statements"],
               step_ms_50_turns=round(profile["growth"][50], 2), step_ms_1000_turns=round(profile["growth"][1000], 2),
               step_ms_3000_turns=round(profile["growth"][3000], 2), step_ratio_3000_to_50_turns=round(profile["growth_ratio"], 2))
    with qcluster(workers=4):
        for n in (5, 20, 50):
            out[f"steps_per_s_{n}"] = round(throughput(n, workdir, reps), 1)
        out["steps_per_s_50_in_10_spaces"] = round(throughput(50, workdir, reps, spaces=10), 1)
        lap("cluster")
    wake = measure_wake(mode, workdir)  # bench.wake_latency runs its own cluster: this one is stopped first
    lap("wake")
    out.update(wake_p50_ratio=round(wake["p50_ratio"], 2), wake_p99_ms=round(wake["p99_ms"], 1))
    for key in ("p50_ms", "bare_p50_ms", "bare_p99_ms", "burst_wakes_per_message", "burst_runs_without_model_call"):
        if key in wake:
            out[f"wake_{key}" if not key.startswith("burst") else key] = round(wake[key], 2)
    for sockets, row in measure_stream(mode, [1, 50], reps).items():
        out[f"stream_p99_ms_{sockets}"] = round(row["p99_ms"], 1)
    lap("stream")
    space, (worker,) = make_space("paired", 1, workdir)
    one_run(space, worker)
    lg = langgraph_step(mode, workdir, reps, veronica=lambda: one_run(space, worker)["step_ms"])
    lap("langgraph")
    out.update(langgraph_step_ms=round(lg["sync"], 2), langgraph_async_step_ms=round(lg["async"], 2),
               langgraph_step_ratio=round(lg["ratio"], 2), langgraph_paired_ms={"veronica": round(lg["paired_veronica"], 2),
                                                                               "langgraph": round(lg["paired_sync"], 2)},
               seconds=timings)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="embedded,hosted")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.reps)))
        return
    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}", flush=True)
    result = {}
    for mode in args.modes.split(","):
        with isolated_env(mode, "bench_engine") as env:
            proc = subprocess.run([sys.executable, __file__, "--child", mode, "--reps", str(args.reps)], cwd=REPO, env=env,
                                  capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{mode} run failed:\n{proc.stderr[-4000:]}")
        result[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"[{mode}] {json.dumps(result[mode])}", flush=True)
    print(f"load after: {os.getloadavg()[0]:.2f}", flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
