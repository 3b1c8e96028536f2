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
