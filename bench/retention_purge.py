"""Benchmark: the retention purge (veronica.engine.retention) on a month of history.

    .venv/bin/python bench/retention_purge.py [--events 20000] [--messages 5000]

Sets Django up against a throwaway SQLite database under data/ (removed afterwards; DATABASE_URL
is ignored so the bench never touches a real database), makes one space with that many 40-day-old
events and read messages (plus as many wake rows), sets retention to 30 days, then prints: the
queries and wall time of one engine-tick purge (bounded: TICK_BATCHES batches per kind), of a
dry run, of the full `vacuum` purge, and of a tick when nothing is left to purge (the steady cost).
"""
from __future__ import annotations

import argparse
import time

from throwaway import throwaway_django


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--messages", type=int, default=5000)
    args = parser.parse_args()

    with throwaway_django("retention-bench-") as tmp:
        from datetime import timedelta

        from django.db import connection
        from django.test.utils import CaptureQueriesContext
        from django.utils import timezone

        from veronica.engine import retention, supervisor
        from veronica.models import Event, Message, Space, Wake

        space = Space.objects.create(name="Bench", slug="bench", workdir=tmp)
        supervisor.add_member(space, "boss", role="leader", actor="bench")
        w1 = supervisor.add_member(space, "w1", actor="bench")
        old = timezone.now() - timedelta(days=40)
        head = Space.objects.get(pk=space.pk).event_seq
        Event.objects.bulk_create([Event(space=space, seq=head + i + 1, kind="bench.old", payload={"n": i})
                                   for i in range(args.events)], batch_size=2000)
        Space.objects.filter(pk=space.pk).update(event_seq=head + args.events)
        Message.objects.bulk_create([Message(space=space, sender_name="boss", recipient=w1, recipient_name="w1", body=f"m{i}",
                                             read_at=old) for i in range(args.messages)], batch_size=2000)
        Wake.objects.bulk_create([Wake(member=w1, source="message", claimed=True) for _ in range(args.messages)], batch_size=2000)
        for model in (Event, Message, Wake):
            model.objects.update(created_at=old)
        Space.objects.filter(pk=space.pk).update(retention_days=30)
        space.refresh_from_db()

        def measure(label: str, fn) -> None:
            with CaptureQueriesContext(connection) as ctx:
                start = time.perf_counter()
                result = fn()
                elapsed = time.perf_counter() - start
            print(f"{label:<28} {elapsed * 1000:9.1f} ms  {len(ctx.captured_queries):5d} queries  {result}")

        print(f"{args.events} old events, {args.messages} read messages, {args.messages} wakes; batch "
              f"{retention.settings.RETENTION_BATCH}, keep {retention.settings.RETENTION_KEEP_EVENTS} events")
        measure("dry run", lambda: retention.purge_space(space, dry_run=True))
        measure("one tick (bounded)", lambda: retention.purge_due())
        measure("vacuum (to the end)", lambda: retention.purge_space(space))
        measure("tick after vacuum", lambda: retention.purge_due())  # its announcement moved the window by one
        measure("steady tick", lambda: retention.purge_due())


if __name__ == "__main__":
    main()
