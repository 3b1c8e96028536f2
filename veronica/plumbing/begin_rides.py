"""PostgreSQL: a transaction's BEGIN rides with its first statement, one round trip instead of two.

psycopg sends BEGIN as a query of its own and waits for its answer before the transaction's first
statement, and in pipeline mode it syncs right after the BEGIN all the same. Every fenced
transaction (a run's step, its brief, its finish) and every claim begins with one statement whose
answer the code needs before anything else: the fence or the claim. Sent in one pipeline with its
BEGIN, the pair costs one round trip (a step was BEGIN, the fence, the event INSERT with its COMMIT:
three, now two). Nothing else changes: the statement runs inside the transaction as before, and an
error in either surfaces from the statement's execute, where the atomic block rolls back.

BeginRides is psycopg's connection with that one difference (its BEGIN in a pipeline is queued
without a sync of its own); every new PostgreSQL connection of Django's becomes one
(connection_created), pooled or not. riding() opens the pipeline around a first statement.
"""
from __future__ import annotations

from contextlib import contextmanager

import psycopg
from psycopg import pq

IDLE = pq.TransactionStatus.IDLE


class BeginRides(psycopg.Connection):
    def _start_query(self):
        if self._pipeline is None or self._autocommit or self.pgconn.transaction_status != IDLE:
            yield from super()._start_query()
            return
        yield from self._exec_command(self._get_tx_start_command())  # queued before the statement: no sync


def adopt(sender, connection, **kwargs) -> None:
    """connection_created: a plain psycopg connection becomes a BeginRides (same state, one method more)."""
    if connection.vendor == "postgresql" and type(connection.connection) is psycopg.Connection:
        connection.connection.__class__ = BeginRides


def starts_transaction(connection) -> bool:
    """The next statement on this Django connection will open its transaction (psycopg's BEGIN)."""
    raw = connection.connection
    return (isinstance(raw, BeginRides) and connection.in_atomic_block and raw._pipeline is None
            and raw.pgconn.transaction_status == IDLE)


@contextmanager
def riding(connection):
    """Around the execute of a statement whose answer is read after the block: when it opens its
    transaction, it and its BEGIN go in one pipeline (the answer is on the cursor at the block's end)."""
    if not starts_transaction(connection):
        yield
        return
    with connection.wrap_database_errors, connection.connection.pipeline():
        yield
