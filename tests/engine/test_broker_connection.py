"""The embedded broker keeps its database connection between polls (issue 13).

django-q2's ORM broker calls close_old_connections() before every poll, and its workers around
every task; with CONN_MAX_AGE=0 that reopened the SQLite file (and re-ran its PRAGMAs) ten times a
second and on every wake. The same holds for hosted connections, so the test runs in both modes.
"""
from __future__ import annotations

from django.db import close_old_connections, connection
from django_q.brokers.orm import ORM


def test_the_orm_broker_reuses_its_connection_across_empty_polls(transactional_db):
    broker = ORM(list_key="vt-broker-connection")
    assert broker.dequeue() is None  # an empty queue: one poll (it sleeps the poll interval)
    opened = connection.connection
    assert opened is not None
    for _ in range(3):
        assert broker.dequeue() is None
        assert connection.connection is opened, "the broker reopened its database connection on a poll"


def test_a_workers_close_old_connections_keeps_a_healthy_connection(transactional_db):
    connection.ensure_connection()
    opened = connection.connection
    close_old_connections()  # what django-q2 calls before and after every task
    connection.ensure_connection()
    assert connection.connection is opened


def test_a_wake_claims_first_and_stamps_its_run_with_the_next_statement(space, monkeypatch):
    """Commit -> run start (issue 13): no health-check round trip and no member read before the Run
    row, whose started_at is the run's start."""
    from django.test.utils import CaptureQueriesContext

    from veronica.swarm import bus
    from veronica.engine import runner, supervisor

    w1 = supervisor.get_member(space, "w1")
    bus.send(space, "boss", "w1", "hi")
    connection.health_check_done = False  # what django-q2's close_old_connections() before every task does
    checks = []
    monkeypatch.setattr(connection, "is_usable", lambda: checks.append(1) or True)  # the check's SELECT 1 (not captured)
    with CaptureQueriesContext(connection) as seen:
        runner.wake(w1.pk, "resume")
    statements = [q["sql"].lstrip().upper() for q in seen.captured_queries]
    statements = [s for s in statements if not s.startswith(("BEGIN", "SAVEPOINT", "RELEASE SAVEPOINT"))]
    if connection.vendor == "postgresql":  # the claim's one statement: its UPDATE, then the Run row's INSERT
        assert statements[0].startswith('WITH C AS (UPDATE "VERONICA_MEMBER"') and 'INSERT INTO "VERONICA_RUN"' in statements[0]
    else:
        assert statements[0].startswith("UPDATE") and "MEMBER" in statements[0].split("SET")[0]
        assert statements[1].startswith("INSERT") and "RUN" in statements[1].split("(")[0]
    assert checks == [], "the claim is the health check"


def test_a_wake_on_a_dead_connection_claims_again_on_a_new_one(transactional_db, tmp_path):
    """The claim doubles as the health check django-q2 re-arms before every task: a connection the
    database dropped (a restart, a proxy's idle timeout) fails it, and the wake claims again."""
    import pytest

    if connection.vendor != "postgresql":
        pytest.skip("SQLite connections do not die under a process")
    from tests.conftest import make_space
    from veronica.swarm import bus
    from veronica.engine import runner, supervisor
    from veronica.models import Run

    space = make_space(tmp_path, workers=("w1",))
    w1 = supervisor.get_member(space, "w1")
    bus.send(space, "boss", "w1", "hi")
    connection.ensure_connection()
    with connection.connection.cursor() as cur:  # the server ends this backend, behind Django's back
        cur.execute("SELECT pg_backend_pid()")
        pid = cur.fetchone()[0]
    import psycopg

    with psycopg.connect(connection.settings_dict.get("NAME") and _dsn(), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    close_old_connections()
    assert runner.wake(w1.pk, "message") == "done"
    assert Run.objects.filter(member=w1).count() == 1


def _dsn() -> str:
    s = connection.settings_dict
    return f"host={s['HOST'] or '127.0.0.1'} port={s['PORT'] or 5432} user={s['USER']} dbname={s['NAME']}" + (
        f" password={s['PASSWORD']}" if s.get("PASSWORD") else "")
