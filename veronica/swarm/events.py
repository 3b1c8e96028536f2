"""The event pump: every mutation writes one Event row, then rings the space's listeners on commit
(hosted: veronica.plumbing.redisbell; embedded: veronica.plumbing.doorbell, and the in-memory layer in-process).

The seq comes from an F() increment of the space's counter inside the caller's transaction. The
UPDATE takes the space row's write lock until commit, so a later seq can never commit before an
earlier one (auto-increment ids can, on PostgreSQL), and a rollback takes the increment with it:
the sequence is gapless and its order is commit order.

A run's step batches its events (`batch()`, used by the run's fence): they are buffered and written
at the end of the step's transaction in one statement that takes the whole block of seqs
(`UPDATE ... SET event_seq = event_seq + n RETURNING event_seq`) and one multi-row INSERT, just before
the commit; on PostgreSQL both are one statement (the UPDATE in a data-modifying CTE of the INSERT). The space row is then locked for those two statements and the commit only, not for the
whole step: the members of one space no longer queue behind each other's steps, and seq stays gapless
and in commit order. One ring per batch (the socket reads everything after what it has seen).

On PostgreSQL that statement also carries the rows other code deferred to it (defer_insert: a step's
turns, waggle's observation), each table's rows as one JSON parameter (json_to_recordset), and, when
the batch is its own outermost transaction (transaction_batch), the COMMIT in the same pipeline: a
read step is two round trips, its fence and this.
"""
from __future__ import annotations

import json
import logging
import threading
from contextlib import contextmanager

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.models import F

from veronica.ops import alerts, tracing
from veronica.plumbing import doorbell, redisbell
from veronica.models import Event, Member, Space
from veronica.plumbing.returning import inserted, insert_rows, json_insert_statement
from veronica.plumbing.secret_store import mask_data

log = logging.getLogger(__name__)


def group_name(space_id: int) -> str:
    return f"space-{space_id}"


class _Batch:
    """The events of one transaction, written together just before it commits."""

    def __init__(self, commit: bool = False) -> None:
        # This thread's connection, looked up once: a batch lives and ends on the thread that opened it
        # (django.db.connection resolves the thread's connection again on every attribute).
        self.conn = conn = connections[DEFAULT_DB_ALIAS]
        self.depth = len(conn.atomic_blocks)  # emits at exactly this depth are buffered
        self.commit = commit  # the block's atomic ends with the batch (transaction_batch)
        self.pending: list[Event] = []
        self.deferred: list[tuple[type, list]] = []  # (model, new rows) written in the events' statement

    def covers(self) -> bool:
        """True when no savepoint was opened since the batch began (it would roll back alone)."""
        # savepoint_ids[i] belongs to atomic_blocks[i + 1] (the outermost block has no savepoint)
        conn = self.conn
        return len(conn.atomic_blocks) >= self.depth >= 1 and not any(conn.savepoint_ids[self.depth - 1:])

    def commits_here(self) -> bool:
        """PostgreSQL: this batch's block is the outermost transaction and will commit (no rollback is
        due), so its last statement may carry the COMMIT in the same round trip (see _write_blocks_pg)."""
        import psycopg

        conn = self.conn
        return (self.commit and self.depth == 1 and len(conn.atomic_blocks) == 1 and not conn.needs_rollback
                and psycopg.capabilities.has_pipeline())

    def flush(self) -> None:
        by_space: dict[int, list[Event]] = {}
        for event in self.pending:
            by_space.setdefault(event.space_id, []).append(event)
        self.pending, deferred, self.deferred = [], self.deferred, []
        if by_space and self.conn.vendor == "postgresql":
            lasts = _write_blocks_pg(by_space, deferred, commit=self.commits_here())
            for space_id, last in lasts.items():
                transaction.on_commit(lambda space_id=space_id, last=last: ring(space_id, last))
            return
        for space_id, rows in by_space.items():
            with connection.cursor() as cur:
                cur.execute(f"UPDATE {Space._meta.db_table} SET event_seq = event_seq + %s WHERE id = %s RETURNING event_seq",
                            [len(rows), space_id])
                last = cur.fetchone()[0]
            for i, event in enumerate(rows):
                event.seq = last - len(rows) + 1 + i
            insert_rows(Event, rows)
            transaction.on_commit(lambda space_id=space_id, last=last: ring(space_id, last))
        for model, rows in deferred:  # a batch without events
            insert_rows(model, rows)


_EVENT_COLUMNS = ("space_id", "kind", "member_id", "payload", "created_at")
_PG_TYPES = {"space_id": "bigint", "kind": "text", "member_id": "bigint", "payload": "jsonb", "created_at": "timestamptz"}


def _write_blocks_pg(by_space: dict[int, list[Event]], deferred: list[tuple[type, list]] = (), *,
                     commit: bool = False) -> dict[int, int]:
    """PostgreSQL: each space's seq block and the rows in ONE statement (a data-modifying CTE): a space
    row is locked by the UPDATE inside the statement, so the lock is held for this statement and the
    commit. The deferred rows (defer_insert) are INSERTs of the same statement: a step's turns ride along.
    Returns each space's last seq.

    Several spaces (a gathered claim of many members): their rows are locked in the order of their ids
    (a locking read sorted by id feeds the UPDATE), so two such statements never wait on each other in a
    circle. One statement for all of them, not one per space: a claim of 64 members over three spaces
    held the first space's lock across the round trips of the others and its own COMMIT, while every
    step of that space's members waited on it, each holding one of its worker's pooled connections
    (bench/fleet.py's start burst).

    commit: this is the transaction's last statement and the transaction is the outermost one: the
    statement and its COMMIT go to the server in one pipeline, one round trip instead of two. The
    atomic block's own commit then finds the transaction ended (psycopg's commit is a no-op when idle),
    and runs the on_commit hooks (the rings) after it as always. A failure of either raises here, in
    the block: the atomic block rolls back (a no-op if the server already did) and re-raises."""
    connection = connections[DEFAULT_DB_ALIAS]  # this thread's, looked up once (not per attribute)
    heads, params = [], []
    for k, (model, new_rows) in enumerate(deferred):
        insert, insert_params = json_insert_statement(model, new_rows)
        heads.append(f"d{k} AS ({insert}), ")
        params += insert_params
    created = Event._meta.get_field("created_at")
    spaces = sorted(by_space)
    records = [{"ord": i + 1, "space_id": event.space_id, "kind": event.kind, "member_id": event.member_id,
                "payload": event.payload, "created_at": created.pre_save(event, add=True).isoformat()}
               for space_id in spaces for i, event in enumerate(by_space[space_id])]
    cols = ", ".join(_EVENT_COLUMNS)
    recordset = f"json_to_recordset(%s::json) AS v(ord int, {', '.join(f'{c} {_PG_TYPES[c]}' for c in _EVENT_COLUMNS)})"
    table = Space._meta.db_table
    # every event in one JSON parameter: the statement's text (and its prepared plan) is one per shape
    if len(spaces) == 1:
        n = len(records)
        params += [n, spaces[0], n, json.dumps(records, ensure_ascii=False, separators=(",", ":"))]
        block = f"block AS (UPDATE {table} SET event_seq = event_seq + %s WHERE id = %s RETURNING event_seq), "
        seq, join = "block.event_seq - %s + v.ord", f"FROM block, {recordset}"
    else:
        counts = [len(by_space[space_id]) for space_id in spaces]
        params += [spaces, spaces, counts, json.dumps(records, ensure_ascii=False, separators=(",", ":"))]
        block = (f"locked AS (SELECT id FROM {table} WHERE id = ANY(%s::bigint[]) ORDER BY id FOR UPDATE), "
                 f"block AS (UPDATE {table} AS s SET event_seq = s.event_seq + c.n FROM locked, "
                 f"unnest(%s::bigint[], %s::int[]) AS c(id, n) WHERE s.id = locked.id AND c.id = locked.id "
                 f"RETURNING s.id, s.event_seq, c.n), ")
        seq, join = "block.event_seq - block.n + v.ord", f"FROM block JOIN {recordset} ON v.space_id = block.id"
    sql = (f"WITH {''.join(heads)}{block}"
           f"e AS (INSERT INTO {Event._meta.db_table} (seq, {cols}) "
           f"SELECT {seq}, {', '.join('v.' + c for c in _EVENT_COLUMNS)} {join} "
           f"ORDER BY v.space_id, v.ord RETURNING id, seq, space_id) "
           f"SELECT -1, id, seq, space_id FROM e" + "".join(f" UNION ALL SELECT {k}, id, 0, 0 FROM d{k}" for k in range(len(deferred))))
    with connection.cursor() as cur:
        if commit:
            with connection.wrap_database_errors, connection.connection.pipeline():
                cur.execute(sql, params)
                connection.connection.commit()  # in the pipeline: COMMIT, then one sync for both
        else:
            cur.execute(sql, params)
        result = cur.fetchall()
    for k, (model, new_rows) in enumerate(deferred):  # one statement's ids come from the sequence in row order
        inserted(model, new_rows, sorted(r[1] for r in result if r[0] == k))
    written: dict[int, list] = {}
    for _, pk, seq_, space_id in sorted((r for r in result if r[0] == -1), key=lambda r: r[2]):
        written.setdefault(space_id, []).append((pk, seq_))
    lasts = {}
    for space_id in spaces:
        rows, got = by_space[space_id], written.get(space_id, [])
        if len(got) != len(rows):
            raise RuntimeError(f"space {space_id}: {len(got)} of {len(rows)} events written")
        for event, (pk, seq_) in zip(rows, got):
            event.pk, event.seq = pk, seq_
            event._state.adding, event._state.db = False, connection.alias
        lasts[space_id] = got[-1][1]
    return lasts


_batch = threading.local()


def defer_insert(model, rows: list) -> bool:
    """PostgreSQL, inside a batch that covers this point: these new instances are INSERTed in the
    batch's own statement, just before the commit (their ids are set then). False when not taken: the
    caller writes them now. Nothing may read them back before the batch ends."""
    current = getattr(_batch, "current", None)
    if not rows or current is None or current.conn.vendor != "postgresql" or not current.covers():
        return False
    current.deferred.append((model, rows))
    return True


@contextmanager
def batch(*, _commit: bool = False):
    """Inside an atomic block: buffer this block's emits and write them at its end (see above).
    Emits from a nested savepoint are written at once, so a rolled-back savepoint takes them along."""
    if getattr(_batch, "current", None) is not None or not connection.in_atomic_block:
        yield
        return
    current = _batch.current = _Batch(_commit)
    try:
        yield
        current.flush()
    finally:
        _batch.current = None


@contextmanager
def transaction_batch():
    """transaction.atomic() and batch() ending together. When it is the outermost transaction (and
    PostgreSQL), the batch's statement carries the COMMIT (see _write_blocks_pg): nothing can run
    between the two, which a batch() inside a longer atomic block could not promise."""
    with transaction.atomic(), batch(_commit=True):
        yield


def emit(space_id: int, kind: str, *, member: Member | None = None, **payload: object) -> Event:
    """Persist one event with the space's next seq; signal listeners after the commit."""
    if member is not None:
        payload.setdefault("member_name", member.name)
    payload = mask_data(payload, space_id)  # no secret value of the space in its event (tool results, errors, arguments)
    current = getattr(_batch, "current", None)
    if current is not None and kind != "ops.alert" and current.covers():
        event = Event(space_id=space_id, kind=kind, member=member, payload=payload)
        current.pending.append(event)  # its seq is set when the batch is written
        tracing.on_emit(kind, payload)
        return event
    # No savepoint: an emit is part of its caller's write and fails with it (saves two queries).
    with transaction.atomic(savepoint=False):
        Space.objects.filter(pk=space_id).update(event_seq=F("event_seq") + 1)
        seq = Space.objects.filter(pk=space_id).values_list("event_seq", flat=True).get()
        event = Event.objects.create(space_id=space_id, seq=seq, kind=kind, member=member, payload=payload)
        transaction.on_commit(lambda: ring(space_id, seq))
        if kind == "ops.alert":  # every ops alert also leaves through the space's notifier
            alerts.record(event)
    tracing.on_emit(kind, payload)  # approvals and waggle replays as span events (no-op when tracing is off)
    return event


RECHECK_RING = 0  # a ring for seq 0 asks the space's feeds to re-check their sockets' credentials now (a logout)


def ring(space_id: int, seq: int) -> None:
    """Tell live sockets to look again. At-most-once by design: sockets backfill from the table."""
    if redisbell.enabled():  # hosted: one PUBLISH (veronica.plumbing.redisbell)
        redisbell.ring(space_id, seq)
        return
    if doorbell.enabled():  # embedded: the in-memory layer cannot leave this process, the doorbell can
        try:
            doorbell.ring(space_id, seq)
        except Exception:
            log.warning("doorbell ring failed for space %s seq %s", space_id, seq, exc_info=True)
    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": "space.event", "seq": seq}
    try:
        if getattr(layer, "groups", None):  # in-memory: only this process's sockets can hear it
            async_to_sync(layer.group_send)(group_name(space_id), message)
    except Exception:  # a lost doorbell costs latency only; the socket's poll finds the row
        log.warning("channel layer ring failed for space %s seq %s", space_id, seq, exc_info=True)
