"""One agent step run in this process with a zero-latency scripted model, measured from one model call to
the next (shared by bench/engine.py and bench/ab.py). Imports nothing from the project at module level,
so bench/ab.py can load it by path into a process running another revision's veronica."""
from __future__ import annotations

import statistics
import time
from pathlib import Path

STEPS = 10  # tool steps per in-process run


class Counter:
    """Statements (execute_wrapper) and commits (the connection's commit) while active."""

    active: "Counter | None" = None

    def __init__(self) -> None:
        self.statements = self.commits = 0

    def __call__(self, execute, sql, params, many, context):
        self.statements += 1
        return execute(sql, params, many, context)

    def __enter__(self):
        from django.db import connection

        self._cm = connection.execute_wrapper(self)
        self._cm.__enter__()
        self._commit = connection.commit
        counter = self

        def commit():
            counter.commits += 1
            return counter._commit()
        connection.commit = commit
        Counter.active = self
        return self

    def __exit__(self, *exc):
        from django.db import connection

        connection.commit = self._commit
        Counter.active = None
        self._cm.__exit__(*exc)


def scripted_provider(steps: int, marks: list):
    """read_file `steps` times, then answer. Each call marks (wall, cpu, statements, commits) so a step
    is measured from one model call to the next: the run's start, end and transcript load excluded."""
    from veronica.agent.providers.base import Reply, ToolCall, Usage

    class Policy:
        n = 0

        def complete(self, system, messages, tools, *, should_stop, on_event=None):
            counter = Counter.active
            marks.append((time.perf_counter(), time.process_time(), counter.statements, counter.commits))
            self.n += 1
            if self.n > steps:
                return Reply(text="done", usage=Usage(input=10, output=2))
            return Reply(tool_calls=[ToolCall(id=f"c{time.time_ns()}", name="read_file", args={"path": f"f{self.n % 5}.txt"})],
                         usage=Usage(input=10, output=2))
    return Policy


def one_run(space, member, steps: int = STEPS) -> dict:
    """One wake of `member` with `steps` tool steps, run in this process. Per step: the median over its
    steps (call to call); whole-run statements over its model calls as well."""
    import veronica.agent.loop as loop
    from veronica.swarm import bus
    from veronica.engine import runner

    marks: list = []
    policy = scripted_provider(steps, marks)
    loop.get_provider = lambda spec: policy()
    bus.send(space, "lead", member.name, "go")
    with Counter() as counter:
        runner.wake(member.pk, "message")
    deltas = [[b[i] - a[i] for i in range(4)] for a, b in zip(marks, marks[1:])]
    med = [statistics.median(d[i] for d in deltas) for i in range(4)]
    return {"step_ms": med[0] * 1000, "cpu_ms": med[1] * 1000, "sql": med[2], "commits": med[3],
            "whole_run_sql_per_call": counter.statements / (steps + 1), "statements": counter.statements}


def make_space(slug: str, workers: int, workdir: Path):
    from veronica.engine import supervisor
    from veronica.models import Member, Role, Space

    space = Space.objects.create(name=slug, slug=slug, workdir=str(workdir))
    supervisor.add_member(space, "lead", role=Role.LEADER, actor="bench")
    members = [supervisor.add_member(space, f"w{i}", actor="bench") for i in range(workers)]
    Member.objects.filter(space=space).update(max_iterations=1000)
    return space, [Member.objects.get(pk=m.pk) for m in members]
