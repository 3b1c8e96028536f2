"""Benchmark: the served A2A door, in-process (Django's test client, no network).

    .venv/bin/python bench/a2a_serve.py [--repeat 30]

Sets Django up against a throwaway SQLite database under data/ and prints medians of: message/send
(a mail and a task on the board), tasks/get, a refused call (bad credential) and a malformed body,
each with its SQL statements; the last line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from throwaway import throwaway_django


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()

    with throwaway_django("a2a-bench-"):
        from pathlib import Path

        from django.db import connection
        from django.test import Client
        from django.test.utils import CaptureQueriesContext

        from django.conf import settings

        from veronica.swarm import a2a_settings
        from veronica.engine import supervisor
        from veronica.models import Role, Space

        settings.ALLOWED_HOSTS = ["*"]
        workdir = Path(settings.DATA_DIR) / "bench-space"  # inside the throwaway folder
        workdir.mkdir(parents=True, exist_ok=True)
        space = Space.objects.create(name="Bench", slug="bench", workdir=str(workdir))
        supervisor.add_member(space, "boss", role=Role.LEADER, actor="bench")
        a2a_settings.set_enabled(space, True, actor="bench")
        _, key = a2a_settings.create_credential(space, "bench", "operator", actor="bench")
        client, auth = Client(), {"HTTP_AUTHORIZATION": f"Bearer {key}"}

        def body(method, params):
            return json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})

        def send():
            message = {"role": "user", "messageId": "m", "parts": [{"kind": "text", "text": "Summarise the open tasks"}]}
            return client.post("/a2a/bench/", body("message/send", {"message": message}), content_type="application/json", **auth)

        task_id = send().json()["result"]["id"]
        cases = {
            "send": send,
            "get": lambda: client.post("/a2a/bench/", body("tasks/get", {"id": task_id}), content_type="application/json", **auth),
            "refused_401": lambda: client.post("/a2a/bench/", body("tasks/get", {"id": task_id}), content_type="application/json",
                                               HTTP_AUTHORIZATION="Bearer a2a_wrong"),
            "malformed": lambda: client.post("/a2a/bench/", "{nope", content_type="application/json", **auth),
        }
        figures = {}
        for name, fn in cases.items():
            times = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                fn()
                times.append((time.perf_counter() - start) * 1000)
            with CaptureQueriesContext(connection) as queries:
                fn()
            figures[f"{name}_ms"] = round(statistics.median(times), 2)
            figures[f"{name}_queries"] = len(queries)
            print(f"{name:12s} median {figures[f'{name}_ms']:7.2f} ms, {len(queries)} statements")
        print(json.dumps({"bench": "a2a_serve", "repeat": args.repeat, **figures}))


if __name__ == "__main__":
    main()
