"""Benchmark: the event stream's periodic credential re-check (veronica.web.stream_auth.recheck).

    .venv/bin/python bench/socket_recheck.py [--sockets 10 100 1000] [--samples 50]

Sets Django up against a throwaway SQLite database under data/ (removed afterwards; DATABASE_URL
is ignored so the bench never touches a real database), makes one space and, for each size, that
many open sockets of one feed (half session cookies, half API tokens, over 20 users), then times
one re-check of all of them: the queries it makes (fixed: users + tokens + sessions) and its
median and p95 wall time. A feed runs it every VERONICA_SOCKET_RECHECK_SECONDS.
"""
from __future__ import annotations

import argparse
import statistics
import time

from throwaway import throwaway_django


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sockets", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--samples", type=int, default=50)
    args = parser.parse_args()

    with throwaway_django("recheck-bench-") as tmp:
        from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
        from django.contrib.auth.models import User
        from django.contrib.sessions.backends.db import SessionStore
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        from veronica.swarm import access
        from veronica.models import Space, SpaceAccess
        from veronica.web.stream_auth import Credential, recheck

        space = Space.objects.create(name="Bench", slug="bench", workdir=tmp)
        users = [User.objects.create_user(f"u{i}") for i in range(20)]
        SpaceAccess.objects.bulk_create([SpaceAccess(user=u, space=space, role="viewer") for u in users])

        def session_for(user) -> str:
            store = SessionStore()
            store[SESSION_KEY], store[BACKEND_SESSION_KEY] = str(user.pk), "django.contrib.auth.backends.ModelBackend"
            store[HASH_SESSION_KEY] = user.get_session_auth_hash()
            store.create()
            return store.session_key

        print(f"{'sockets':>8} {'queries':>8} {'median':>10} {'p95':>10}")
        for n in args.sockets:
            creds = []
            for i in range(n):
                user = users[i % len(users)]
                if i % 2:
                    token, _ = access.create_token(user, f"t{i}")
                    creds.append(Credential(user_id=user.pk, token_id=token.pk))
                else:
                    creds.append(Credential(user_id=user.pk, session_key=session_for(user)))
            with CaptureQueriesContext(connection) as queries:
                assert recheck(space.pk, creds) == {}
            times = []
            for _ in range(args.samples):
                start = time.perf_counter()
                recheck(space.pk, creds)
                times.append(time.perf_counter() - start)
            times.sort()
            p95 = times[min(len(times) - 1, int(len(times) * 0.95))]
            print(f"{n:>8} {len(queries):>8} {statistics.median(times) * 1000:>8.2f}ms {p95 * 1000:>8.2f}ms")


if __name__ == "__main__":
    main()
