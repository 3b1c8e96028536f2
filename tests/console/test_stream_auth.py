"""The socket re-check in isolation: verdicts per credential, and a fixed query count."""
from __future__ import annotations

from django.contrib.sessions.backends.db import SessionStore
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.console.conftest import session_cookie
from veronica.swarm import access
from veronica.web.stream_auth import CLOSE_ACCESS_GONE, CLOSE_CREDENTIALS_GONE, Credential, recheck


def session_cred(user) -> Credential:
    return Credential(user_id=user.pk, session_key=session_cookie(user))


def token_cred(user) -> Credential:
    token, _ = access.create_token(user, "t")
    return Credential(user_id=user.pk, token_id=token.pk)


def test_verdicts_name_what_ended(world):
    live, revoked, flushed, moved = token_cred(world.viewer), token_cred(world.viewer), session_cred(world.operator), session_cred(world.owner)
    stolen = Credential(user_id=world.viewer.pk, session_key=flushed.session_key)  # someone else's session
    staff, stranger = session_cred(world.staff), session_cred(world.stranger)
    access.revoke_token(world.viewer, revoked.token_id)
    SessionStore(flushed.session_key).delete()
    world.owner.set_password("changed elsewhere")
    world.owner.save()
    verdicts = recheck(world.space.pk, [live, revoked, flushed, moved, stolen, staff, stranger])
    assert verdicts == {revoked: CLOSE_CREDENTIALS_GONE, flushed: CLOSE_CREDENTIALS_GONE, moved: CLOSE_CREDENTIALS_GONE,
                        stolen: CLOSE_CREDENTIALS_GONE, stranger: CLOSE_ACCESS_GONE}


def test_a_deleted_space_closes_even_staff(world):
    staff = session_cred(world.staff)
    space_id = world.space.pk
    assert recheck(space_id, [staff]) == {}
    world.space.delete()
    assert recheck(space_id, [staff]) == {staff: CLOSE_ACCESS_GONE}


def test_one_recheck_costs_three_queries_whatever_the_number_of_sockets(world):
    few = [session_cred(world.viewer), token_cred(world.operator)]
    many = few + [session_cred(u) for u in (world.viewer, world.operator, world.staff) for _ in range(5)]
    many += [token_cred(world.viewer) for _ in range(10)]
    for creds in (few, many):
        with CaptureQueriesContext(connection) as queries:
            assert recheck(world.space.pk, creds) == {}
        assert len(queries) == 3, [q["sql"] for q in queries]
