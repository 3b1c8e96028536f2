"""Shared personas and spaces, built through the real verbs (never hand-made rows)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.own_names import claim_session_names, sweep
from veronica.engine import supervisor
from veronica.models import Role, Space

REPO = Path(__file__).resolve().parent.parent
DEMO_MANIFEST = REPO / "examples" / "demo-team"

claim_session_names()


def pytest_sessionfinish(session, exitstatus):
    """Leave the Redis we were given as we found it: this session's queues, channels and keys go."""
    from django.conf import settings

    if getattr(settings, "REDIS_URL", None):
        sweep(settings.REDIS_URL)


def make_space(tmp_path: Path, slug: str = "alpha", workers: tuple[str, ...] = ("w1", "w2"), **settings) -> Space:
    workdir = tmp_path / slug
    workdir.mkdir(parents=True, exist_ok=True)
    space = Space.objects.create(name=slug.title(), slug=slug, workdir=str(workdir), **settings)
    supervisor.add_member(space, "boss", role=Role.LEADER, actor="test")
    for name in workers:
        supervisor.add_member(space, name, role=Role.WORKER, actor="test")
    return space


@pytest.fixture(autouse=True)
def _fresh_waggle_caches():
    """A test's rolled-back routes and sessions (whose ids SQLite hands out again) are not this one's:
    start from empty per-process caches, as a new worker process would."""
    from waggle import recording, routecache

    routecache.changed()
    recording._quiet.clear()
    yield


@pytest.fixture(autouse=True)
def inline_waggle_mining(settings):
    """Tests drive runs in-process with no cluster: waggle mines inline, deterministically."""
    settings.WAGGLE = {**getattr(settings, "WAGGLE", {}), "sweep_async": False}


@pytest.fixture
def space(db, tmp_path):
    return make_space(tmp_path)


@pytest.fixture
def demo_manifest(tmp_path) -> Path:
    """The demo template as a manifest folder of the test's own, its starting files in workspace/: a
    bundled template is never registered in place (a space run there would leave files in it)."""
    folder = tmp_path / "demo-manifest"
    shutil.copytree(DEMO_MANIFEST, folder, ignore=shutil.ignore_patterns("starter"))
    shutil.copytree(DEMO_MANIFEST / "starter", folder / "workspace")
    return folder


@pytest.fixture(scope="session", autouse=True)
def close_stray_connections(django_db_setup, django_db_blocker):
    """Threads that keep a persistent PostgreSQL connection (the socket feed) would otherwise block
    dropping the test database at the end of the session."""
    yield
    from django.conf import settings
    from django.db import connection

    with django_db_blocker.unblock():
        if connection.vendor == "postgresql" and getattr(settings, "DB_POOLER", "none") == "transaction":
            # Through PgBouncer our own connection's server session stays in its pool: end every
            # session on the test database from a connection to another one.
            connection.close()
            with connection._nodb_cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                               [connection.settings_dict["NAME"]])
        elif connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                               "WHERE datname = current_database() AND pid <> pg_backend_pid()")
