"""Benchmark: portable spaces and the run trace view.

    .venv/bin/python bench/portable_trace.py [--repeat 15]

Sets Django up against a throwaway SQLite database under data/ (removed afterwards; DATABASE_URL is
ignored so the bench never touches a real database) and prints medians of:
- export_archive of the demo template, and of the same space with 20 more members (the ratio says
  how export grows with members), and create_from_archive of that archive;
- the trace page's data (run_trace.trace) for a run of 10 and of 400 events, and its queries;
- the statements one metered model call costs (metering.record: usage, run counters, model.called).
"""
from __future__ import annotations

import argparse
import statistics
import time

from throwaway import throwaway_django


def median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()

    with throwaway_django("portable-bench-"):
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        from veronica.web import run_trace
        from veronica.swarm import events
        from veronica.portable import archive as portable
        from veronica.agent import metering
        from veronica.agent.providers.base import Usage
        from veronica.engine import slot, supervisor
        from veronica.models import Run

        small = portable.create_from_template("demo-team", "bench-small")
        big = portable.create_from_template("demo-team", "bench-big")
        for i in range(20):
            supervisor.add_member(big, f"extra{i:02d}", actor="bench", persona="A worker. " * 40)
        small_ms = median_ms(lambda: portable.export_archive(small), args.repeat)
        big_ms = median_ms(lambda: portable.export_archive(big), args.repeat)
        archive = portable.export_archive(big)
        counter = iter(range(10_000))
        import_ms = median_ms(lambda: portable.create_from_archive(archive, f"copy-{next(counter)}"), max(3, args.repeat // 3))
        print(f"export: demo (3 members) {small_ms:.1f} ms, 23 members {big_ms:.1f} ms, ratio {big_ms / small_ms:.2f}; "
              f"archive {len(archive)} bytes; import of it {import_ms:.1f} ms")

        def fake_run(member_name: str, calls: int) -> Run:
            member = supervisor.get_member(small, member_name)
            lease = slot.claim(member, "message")
            for i in range(calls):
                slot.write_phase(lease.member, "thinking")
                metering.record(lease, member.model, Usage(input=100, output=10))
                events.emit(small.pk, "tool.called", member=member, tool="list_dir", args={})
                slot.write_phase(lease.member, "executing", "list_dir")
                events.emit(small.pk, "tool.result", member=member, tool="list_dir", ok=True, chars=3, preview=f"#{i}")
            slot.finish(lease, "done")
            return Run.objects.get(pk=lease.run.pk)

        short, long = fake_run("scout", 2), fake_run("analyst", 80)
        n_short = len(run_trace._run_events(short))
        n_long = len(run_trace._run_events(long))
        short_ms = median_ms(lambda: run_trace.trace(short), args.repeat)
        long_ms = median_ms(lambda: run_trace.trace(long), args.repeat)
        with CaptureQueriesContext(connection) as q_short:
            run_trace.trace(short)
        with CaptureQueriesContext(connection) as q_long:
            run_trace.trace(long)
        print(f"trace: {n_short} events {short_ms:.2f} ms ({len(q_short)} queries), {n_long} events {long_ms:.2f} ms "
              f"({len(q_long)} queries), ratio {long_ms / short_ms:.1f} for {n_long / n_short:.0f}x the events")

        lead = supervisor.get_member(small, "lead")
        lease = slot.claim(lead, "message")
        with CaptureQueriesContext(connection) as q_meter:
            metering.record(lease, lead.model, Usage(input=100, output=10))
        emits = sum("veronica_event" in q["sql"] and q["sql"].startswith("INSERT") for q in q_meter.captured_queries)
        print(f"metering.record: {len(q_meter)} statements per model call, of which the model.called event is 3 "
              f"(space seq update + read + {emits} event insert)")
        slot.finish(lease, "done")


if __name__ == "__main__":
    main()
