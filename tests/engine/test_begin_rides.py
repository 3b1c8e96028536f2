"""A transaction's BEGIN rides with its first statement on PostgreSQL (veronica.plumbing.begin_rides):
the fence or the claim that opens every run transaction costs one round trip with its BEGIN, not two.
Round trips are counted on the wire (libpq's trace: each Query or Sync the client sends is one)."""
from __future__ import annotations

import tempfile
from contextlib import contextmanager

import pytest
from django.db import IntegrityError, connection, transaction
from psycopg import pq

from veronica.engine import slot, supervisor
from veronica.models import Member
from veronica.plumbing.returning import update_returning

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(connection.vendor != "postgresql", reason="psycopg's BEGIN is PostgreSQL's")]


@contextmanager
def wire():
    """The messages the client sends meanwhile: ["Query", "Parse", "Bind", "Execute", "Sync", ...]; a
    simple query of BEGIN alone is "BEGIN" (client-side binding sends other statements as queries too)."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    sent: list[str] = []
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield sent
        finally:
            pgconn.untrace()
            trace.seek(0)
            for line in trace.read().splitlines():
                fields = line.split("\t")
                if fields[0] == "F":
                    sent.append("BEGIN" if fields[2] == "Query" and '"BEGIN"' in line else fields[2])


def round_trips(sent: list[str]) -> int:
    return sum(1 for m in sent if m in ("BEGIN", "Query", "Sync"))


def renew(member_id: int, tokens: str = "t") -> tuple | None:
    def build(s):
        return Member.objects.filter(pk=s.int("id"), lease_token=s.str("token")), {"phase": s.str("phase")}
    return update_returning(("test-ride",), build, ["id"], {"id": member_id, "token": tokens, "phase": "thinking"})


def test_a_transactions_first_statement_carries_its_begin(space):
    w1 = supervisor.get_member(space, "w1")
    Member.objects.filter(pk=w1.pk).update(lease_token="t")
    with transaction.atomic():
        with wire() as sent:
            assert renew(w1.pk) == (w1.pk,)
        assert connection.connection.pgconn.transaction_status == pq.TransactionStatus.INTRANS
        assert renew(w1.pk) == (w1.pk,)  # its second run prepares it (psycopg: Parse, then a round trip of its own)
        with wire() as later:
            assert renew(w1.pk) == (w1.pk,)
    assert "BEGIN" not in sent and round_trips(sent) == 1, sent  # BEGIN (in the pipeline) and the UPDATE
    assert round_trips(later) == 1, "a statement inside the transaction is sent as before"


def test_the_statement_is_inside_the_transaction_it_opened(space):
    w1 = supervisor.get_member(space, "w1")
    Member.objects.filter(pk=w1.pk).update(lease_token="t", phase="ready")
    with pytest.raises(RuntimeError), transaction.atomic():
        assert renew(w1.pk) == (w1.pk,)
        raise RuntimeError("rolled back")
    assert Member.objects.get(pk=w1.pk).phase == "ready", "the riding statement rolled back with its transaction"
    assert renew(w1.pk, "other") is None  # autocommit: nothing rides, nothing matched


def test_a_failing_first_statement_fails_its_block_and_leaves_the_connection_usable(space):
    w1 = supervisor.get_member(space, "w1")

    def breaks(s):  # max_iterations >= 1 is a check constraint
        return Member.objects.filter(pk=s.int("id")), {"max_iterations": 0}
    with pytest.raises(IntegrityError), transaction.atomic():
        update_returning(("test-ride-fails",), breaks, ["id"], {"id": w1.pk})
    assert Member.objects.get(pk=w1.pk).max_iterations >= 1


def test_a_claim_carries_its_begin(space):
    from veronica.swarm import bus

    w1 = supervisor.get_member(space, "w1")
    bus.send(space, "boss", "w1", "hello")
    with wire() as sent:
        lease = slot.claim(w1.pk, "message")
    assert lease is not None
    assert "BEGIN" not in sent, f"BEGIN went alone: {sent}"


# A read_file step and the answer, on the wire: measured 35 (40 before: the claim, the brief, both
# steps and the finish each sent their BEGIN alone).
RUN_ROUND_TRIPS = 35


def test_a_members_run_sends_no_begin_alone(space, scripted, rung):
    """A one-call run of a member whose session is open already: its claim, its brief, its model turn
    and its finish each open their transaction with the statement that carries the BEGIN."""
    from pathlib import Path

    from veronica.engine import runner
    from veronica.swarm import bus

    Path(space.workdir, "f.txt").write_text("file\n")
    w1 = supervisor.get_member(space, "w1")
    for text in ("first", "second"):  # the first opens the session, the blackboard and today's usage row
        scripted(("read_file", {"path": "f.txt"}), "done")
        bus.send(space, "boss", "w1", text)
        with wire() as sent:
            assert runner.wake(w1.pk, "message") == "done"
    assert "BEGIN" not in sent, sent
    assert round_trips(sent) <= RUN_ROUND_TRIPS, sent
