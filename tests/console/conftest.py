"""Personas for the console tests: one space, a user per role, a stranger with a space of their own."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.contrib.auth.models import User
from django.test import Client

from veronica.swarm import access
from veronica.engine import supervisor
from veronica.models import Role, Space

PASSWORD = "correct horse battery staple"


@dataclass
class World:
    space: Space
    other: Space
    owner: User
    operator: User
    viewer: User
    stranger: User
    staff: User

    def client(self, user: User | None, *, csrf: bool = False) -> Client:
        c = Client(enforce_csrf_checks=csrf)
        if user is not None:
            c.force_login(user)
        return c


def make_space(tmp_path, slug: str, workers: tuple[str, ...] = ("w1", "w2")) -> Space:
    workdir = tmp_path / slug
    workdir.mkdir(parents=True, exist_ok=True)
    space = Space.objects.create(name=slug.title(), slug=slug, workdir=str(workdir))
    supervisor.add_member(space, "boss", role=Role.LEADER, actor="test")
    for name in workers:
        supervisor.add_member(space, name, actor="test")
    return space


def make_world(tmp_path) -> World:
    space = make_space(tmp_path, "alpha")
    other = make_space(tmp_path, "beta", workers=("x1",))
    # no passwords (hashing is slow): tests log in with force_login; login tests set one explicitly
    users = {name: User.objects.create_user(name) for name in ("owner", "operator", "viewer", "stranger")}
    # the deployment's administrator: owner of every space as a superuser (staff status alone grants
    # no role in a space; tests/console/test_staff_roles.py covers staff by permission)
    staff = User.objects.create_user("staff", is_staff=True, is_superuser=True)
    for name in ("owner", "operator", "viewer"):
        access.grant(space, name, name, actor="test")
    access.grant(other, "stranger", "owner", actor="test")
    return World(space=space, other=other, staff=staff, **users)


@pytest.fixture
def world(db, tmp_path) -> World:
    return make_world(tmp_path)


@pytest.fixture(scope="module")
def live_env(django_db_setup) -> dict[str, str]:
    """The environment for server subprocesses: this session's test database and data dir."""
    from tests.console.servers import server_env

    return server_env()


@pytest.fixture(scope="module")
def live_web(live_env):
    """A real daphne serving veronica.asgi against the test database (tests need transactional_db).
    Add `ServerProcess.qcluster(live_env)` next to it when a test needs the engine's workers."""
    from tests.console.servers import ServerProcess

    server = ServerProcess.daphne(live_env)
    yield server
    server.stop()


@pytest.fixture
def live_workers(live_env, live_web, transactional_db):
    """The django-q2 cluster (the run engine's workers) on the same database and queue as live_web.

    One per test, stopped before the test's flush: a cluster left running into the next test's
    flush keeps stepping the last test's members, and its row locks deadlock the flush's TRUNCATE."""
    from tests.console.servers import ServerProcess
    from tests.harness import settle_backends

    workers = ServerProcess.qcluster(live_env)
    yield workers
    workers.stop()
    settle_backends()


@pytest.fixture
def live_world(transactional_db, tmp_path) -> World:
    return make_world(tmp_path)


def session_cookie(user: User) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value
