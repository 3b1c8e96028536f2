"""Gapless per-space seq under concurrent emitters (threads, each with its own connection)."""
import threading

import pytest
from django.db import connection, connections

from veronica.swarm import events
from veronica.models import Event, Space


@pytest.mark.django_db(transaction=True)
def test_concurrent_emitters_get_a_gapless_sequence(tmp_path):
    space = Space.objects.create(name="c", slug="c", workdir=str(tmp_path))
    threads, per_thread, errors = 6, 25, []

    def work():
        try:
            for _ in range(per_thread):
                events.emit(space.pk, "tick")
        except Exception as exc:  # pragma: no cover - surfaced below
            errors.append(exc)
        finally:
            connections.close_all()

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors
    seqs = sorted(Event.objects.filter(space=space).values_list("seq", flat=True))
    assert seqs == list(range(1, threads * per_thread + 1))
    # commit order equals seq order: ids (allocation order) sorted by seq are what we got back
    assert Space.objects.get(pk=space.pk).event_seq == threads * per_thread
    assert connection.vendor in ("sqlite", "postgresql")
