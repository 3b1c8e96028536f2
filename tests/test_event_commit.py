"""PostgreSQL: a batch's last statement carries its transaction's COMMIT (one round trip for both) when
the batch is the outermost transaction; the rings still go after the commit, and a failure of either
the statement or the COMMIT leaves nothing written (events.Batch.commits_here, _write_blocks_pg)."""
from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, connections, transaction

from veronica.swarm import events
from veronica.models import Event, Space

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(connection.vendor != "postgresql", reason="the commit rides a pipeline on PostgreSQL")]


@pytest.fixture
def space(tmp_path):
    return Space.objects.create(name="c", slug="c", workdir=str(tmp_path))


@pytest.fixture
def rings(monkeypatch):
    heard = []
    monkeypatch.setattr(events, "ring", lambda space_id, seq: heard.append(seq))
    return heard


def seen_elsewhere(space) -> int:
    """Rows another connection sees: committed ones only."""
    other = connections.create_connection("default")
    try:
        with other.cursor() as cur:
            cur.execute("SELECT count(*) FROM veronica_event WHERE space_id = %s", [space.pk])
            return cur.fetchone()[0]
    finally:
        other.close()


def server_in_transaction() -> bool:
    from psycopg.pq import TransactionStatus

    return connection.connection.pgconn.transaction_status != TransactionStatus.IDLE


def test_the_outermost_batch_commits_with_its_statement_and_rings_after_the_block(space, rings, monkeypatch):
    real, states = events._write_blocks_pg, []

    def write(*args, **kwargs):
        last = real(*args, **kwargs)
        states.append((server_in_transaction(), seen_elsewhere(space), list(rings)))  # just after the statement
        return last
    monkeypatch.setattr(events, "_write_blocks_pg", write)
    with events.transaction_batch():
        events.emit(space.pk, "a.b")
        events.emit(space.pk, "a.c")
    assert states == [(False, 2, [])]  # committed with its statement, rung only after the block's end
    assert rings == [2] and seen_elsewhere(space) == 2
    assert list(Event.objects.filter(space=space).order_by("seq").values_list("seq", flat=True)) == [1, 2]


def test_a_plain_batch_or_an_inner_one_leaves_the_commit_to_the_atomic_block(space, rings):
    with transaction.atomic():
        with events.batch():  # code may follow it in the block: never committed early
            events.emit(space.pk, "a.b")
        assert server_in_transaction() and seen_elsewhere(space) == 0
        Space.objects.filter(pk=space.pk).update(name="d")
    assert seen_elsewhere(space) == 1 and rings == [1]
    with transaction.atomic():
        with events.transaction_batch():  # a savepoint of the outer block
            events.emit(space.pk, "a.c")
        assert server_in_transaction() and seen_elsewhere(space) == 1
    assert seen_elsewhere(space) == 2 and rings == [1, 2]


def test_a_commit_that_fails_leaves_nothing_and_the_connection_usable(space, rings):
    """A deferred foreign key is checked at COMMIT: the COMMIT in the pipeline fails, the block raises."""
    with pytest.raises(IntegrityError):
        with events.transaction_batch():
            events.emit(space.pk, "a.b")
            events._batch.current.pending.append(Event(space_id=space.pk, kind="a.c", member_id=10 ** 9, payload={}))
    assert seen_elsewhere(space) == 0 and rings == []
    assert Space.objects.get(pk=space.pk).event_seq == 0
    events.emit(space.pk, "a.d")  # the connection goes on
    assert list(Event.objects.filter(space=space).values_list("seq", flat=True)) == [1]


def test_a_statement_that_fails_leaves_nothing(space, rings):
    with pytest.raises(IntegrityError):
        with events.transaction_batch():
            events.emit(space.pk, "a.b")
            Event.objects.create(space=space, seq=1, kind="taken", payload={})  # the batch's seq 1 collides
    assert seen_elsewhere(space) == 0 and rings == []
    events.emit(space.pk, "a.d")
    assert list(Event.objects.filter(space=space).values_list("seq", flat=True)) == [1]


# --- the rows ride as one JSON parameter (json_to_recordset): values come back as the ORM wrote them ------

ODD_TEXT = 'quote " backslash \\ tab \t newline \n emoji \U0001f41d accents é ß and \u2028 a separator'


def test_the_steps_rows_come_back_exactly_as_given(space):
    from veronica.engine import supervisor
    from veronica.models import Session, Turn, TurnRole

    member = supervisor.add_member(space, "w1", actor="test")
    session = Session.objects.create(member=member)
    calls = [{"id": "c1", "name": "read_file", "args": {"path": ODD_TEXT, "n": 2 ** 53, "f": 1.5, "ok": True, "none": None}}]
    turns = [Turn(session=session, seq=1, role=TurnRole.USER, content=ODD_TEXT, mail_ids=[1, 2]),
             Turn(session=session, seq=2, role=TurnRole.ASSISTANT, content="", tool_calls=calls, tokens=2 ** 31 - 1),
             Turn(session=session, seq=3, role=TurnRole.TOOL, content="", tool_call_id="c1", tool_name="read_file", elided=True)]
    payload = {"text": ODD_TEXT, "nested": {"list": [1, "two", None, False]}, "empty": {}}
    with events.transaction_batch():
        assert events.defer_insert(Turn, turns)
        first = events.emit(space.pk, "a.b", member=member, **payload)
        second = events.emit(space.pk, "a.c")
    assert [t.pk for t in turns] == sorted(t.pk for t in turns) and all(t.pk for t in turns)
    back = {t.seq: t for t in Turn.objects.filter(session=session)}
    for turn in turns:
        got = back[turn.seq]
        assert got.pk == turn.pk
        for field in ("role", "content", "tool_calls", "tool_call_id", "tool_name", "elided", "mail_ids", "tokens", "created_at"):
            assert getattr(got, field) == getattr(turn, field), field
    stored = Event.objects.get(pk=first.pk)
    assert (stored.seq, stored.kind, stored.member_id, stored.created_at) == (first.seq, "a.b", member.pk, first.created_at)
    assert stored.payload == {**payload, "member_name": "w1"}
    assert Event.objects.get(pk=second.pk).seq == first.seq + 1 and Event.objects.get(pk=second.pk).member_id is None


def test_a_steps_statement_has_a_few_parameters_whatever_its_rows(space, monkeypatch):
    """One JSON parameter per table: the driver caches the statement's conversion (it does not for more
    than 50 parameters) and the server reuses one prepared plan for any number of rows."""
    shapes = []

    def spy(execute, sql, params, many, context):
        if sql.startswith("WITH block AS"):
            shapes.append((sql, len(params)))
        return execute(sql, params, many, context)
    with connection.execute_wrapper(spy):
        for n in (1, 3, 40):
            with events.transaction_batch():
                for i in range(n):
                    events.emit(space.pk, "a.b", text="x" * 100, i=i)
    assert len({sql for sql, _ in shapes}) == 1 and {count for _, count in shapes} == {4}


def test_a_batch_over_several_spaces_is_one_statement_that_commits_with_it(tmp_path, rings, monkeypatch):
    """A gathered claim's events span the spaces of its members: one statement writes every space's seq
    block, its deferred rows and (as the outermost batch) the COMMIT, each space's seqs gapless."""
    spaces = [Space.objects.create(name=f"s{i}", slug=f"s{i}", workdir=str(tmp_path)) for i in range(3)]
    events.emit(spaces[1].pk, "before")  # the spaces' counters differ going in
    rings.clear()
    statements, states = [], []
    real = events._write_blocks_pg

    def write(*args, **kwargs):
        lasts = real(*args, **kwargs)
        states.append((server_in_transaction(), seen_elsewhere(spaces[2])))
        return lasts
    monkeypatch.setattr(events, "_write_blocks_pg", write)

    def spy(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)
    with connection.execute_wrapper(spy):
        with events.transaction_batch():
            for space, n in ((spaces[2], 2), (spaces[0], 1), (spaces[1], 3), (spaces[2], 1)):  # out of id order
                for i in range(n):
                    events.emit(space.pk, "a.b", i=i)
    assert len(statements) == 1 and "ORDER BY id FOR UPDATE" in statements[0]
    assert states == [(False, 3)]  # committed with its statement
    seqs = {s.pk: list(Event.objects.filter(space=s).order_by("seq").values_list("seq", flat=True)) for s in spaces}
    assert seqs == {spaces[0].pk: [1], spaces[1].pk: [1, 2, 3, 4], spaces[2].pk: [1, 2, 3]}
    assert sorted(rings) == [1, 3, 4]
    assert [Space.objects.get(pk=s.pk).event_seq for s in spaces] == [1, 4, 3]
    payloads = [e.payload["i"] for e in Event.objects.filter(space=spaces[2]).order_by("seq")]
    assert payloads == [0, 1, 0]  # each space's events in the order they were emitted


def test_a_batch_over_several_spaces_locks_them_in_the_order_of_their_ids(tmp_path):
    """Whatever order the events came in: while the lower space's row is held elsewhere, the batch waits
    on it holding no other space's row (two such batches never wait on each other in a circle)."""
    import threading

    low, high = (Space.objects.create(name=f"s{i}", slug=f"s{i}", workdir=str(tmp_path)) for i in range(2))
    holder = connections.create_connection("default")
    done = threading.Event()

    def batch():
        try:
            with events.transaction_batch():
                events.emit(high.pk, "first")  # the higher id first
                events.emit(low.pk, "second")
        finally:
            connections.close_all()
            done.set()
    try:
        with holder.cursor() as cur:
            holder.set_autocommit(False)
            cur.execute("UPDATE veronica_space SET name = name WHERE id = %s", [low.pk])
            worker = threading.Thread(target=batch)
            worker.start()
            assert not done.wait(1.0)  # waiting on the lower space's row
            cur.execute("SELECT id FROM veronica_space WHERE id = %s FOR UPDATE NOWAIT", [high.pk])  # not held by the batch
            holder.rollback()
        worker.join(10)
        assert done.is_set()
    finally:
        holder.close()
    assert {Space.objects.get(pk=low.pk).event_seq, Space.objects.get(pk=high.pk).event_seq} == {1}
