"""A second process for the learning lock / cache tests (not a test module).

usage: python lease_worker.py DB_NAME COMMAND [ARGS...]
It sets Django up with the project's settings (same environment: SQLite file or DATABASE_URL),
points the default database at the parent's TEST database, runs COMMAND and prints one JSON line.
"""
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "veronica.settings")


def main() -> None:
    db_name, command, *args = sys.argv[1:]
    from django.conf import settings

    settings.DATABASES["default"]["NAME"] = db_name
    import django

    django.setup()

    from learning import api
    from learning.lock import WriterLock
    from learning.models import MinedItem
    from learning.offline import complete as offline_complete
    from learning.sources import Correction, StaticSource

    if command == "reflect":
        n, start_at, delay, ttl = int(args[0]), float(args[1]), float(args[2]), float(args[3])
        source = StaticSource(correction_items=[
            Correction(f"c{i}", ["ops"], f"approval denied: do not run command number {i}; reason: case {i}")
            for i in range(n)
        ])

        def slow_complete(system, prompt):
            time.sleep(delay)
            return offline_complete(system, prompt)

        while time.time() < start_at:
            time.sleep(0.005)
        run = api.run_reflect(source, slow_complete, wait=120, lock_ttl=ttl)
        mined = sorted(MinedItem.objects.filter(pass_run=run).values_list("key", flat=True))
        print(json.dumps({"status": run.status, "mined": mined, "errors": run.errors}))
    elif command == "crash_holding_lock":
        lock = WriterLock(ttl=float(args[0]), label="doomed")
        lock.acquire(wait=30)
        print(json.dumps({"held": lock.token}), flush=True)
        os._exit(3)  # die without releasing: the lease must expire on its own
    elif command == "add_user_rule":
        rule = api.add_user_rule(args[0], args[1], actor="other-process")
        print(json.dumps({"rule": rule.pk}))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main()
