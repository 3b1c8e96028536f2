"""A ring of many members goes to the broker in one push (veronica.engine.wakes.one_push): one RPUSH on
Redis, one transaction of rows on the ORM broker, each task the one a wake of its own would be."""
from __future__ import annotations


import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django_q.conf import Conf
from django_q.signing import SignedPackage

from tests.conftest import make_space
from tests.own_names import own_name
from veronica.engine import supervisor, wakes

pytestmark = pytest.mark.django_db


@pytest.fixture
def queue(monkeypatch):
    """This test's own queue (a cluster name of its own), emptied at the end: the broker's real push."""
    monkeypatch.setattr(Conf, "CLUSTER_NAME", own_name("push"))
    monkeypatch.setattr(Conf, "SYNC", False)
    monkeypatch.setattr(wakes, "_brokers", {})
    broker = wakes.wake_broker()
    yield broker
    broker.purge_queue()


def queued(broker) -> list[dict]:
    if hasattr(broker, "connection") and hasattr(broker.connection, "lrange"):
        packs = broker.connection.lrange(broker.list_key, 0, -1)
    else:
        from django_q.models import OrmQ
        packs = list(OrmQ.objects.filter(key=broker.list_key).order_by("id").values_list("payload", flat=True))
    return [SignedPackage.loads(pack) for pack in packs]


def shape(task: dict) -> dict:
    return {key: value for key, value in task.items() if key not in ("id", "started")}


def test_wakes_asked_for_together_are_one_push_of_the_tasks_a_wake_alone_would_be(queue, monkeypatch):
    pushes, alone = [], []
    real_many = queue.enqueue_many
    monkeypatch.setattr(queue, "enqueue_many", lambda tasks: (pushes.append(len(tasks)), real_many(tasks)))
    real_one = queue.enqueue
    monkeypatch.setattr(queue, "enqueue", lambda task: (alone.append(task), real_one(task))[1])
    with wakes.one_push() as push:
        for member_id in (11, 12, 13):
            assert wakes.enqueue_wake(member_id, "message") is True
        assert queued(queue) == [], "sent at the block's end"
    assert pushes == [3] and alone == [] and push.failed == []
    wakes.enqueue_wake(14, "message")  # one on its own, through async_task
    tasks = queued(queue)
    assert [t["args"] for t in tasks] == [(11, "message"), (12, "message"), (13, "message"), (14, "message")]
    assert shape(tasks[0]) == {**shape(tasks[3]), "name": "wake-11-message", "args": (11, "message")}
    assert tasks[0]["func"] == "veronica.engine.runner.wake" and tasks[0]["save"] is False


def test_a_ring_of_a_broadcast_enqueues_every_member_in_one_push(queue, tmp_path, monkeypatch):
    space = make_space(tmp_path, workers=("w1", "w2", "w3"))
    ids = [supervisor.get_member(space, name).pk for name in ("w1", "w2", "w3")]
    pushes = []
    real_many = queue.enqueue_many
    monkeypatch.setattr(queue, "enqueue_many", lambda tasks: (pushes.append(len(tasks)), real_many(tasks)))
    assert wakes.ring(ids, "message") == sorted(ids)
    assert pushes == [3] and sorted(t["args"][0] for t in queued(queue)) == sorted(ids)
    assert wakes.ring(ids, "message") == [] and pushes == [3], "their flags are up: nothing more"


def test_resumes_and_a_lone_wake_go_as_before(queue, monkeypatch):
    pushes = []
    monkeypatch.setattr(queue, "enqueue_many", lambda tasks: pushes.append(tasks))
    with wakes.one_push():
        wakes.enqueue_wake(21, "resume")  # the head of the list, at once
        wakes.enqueue_wake(22, "message")
    assert pushes == []
    front = queued(queue)
    assert [t["args"] for t in front] == [(21, "resume"), (22, "message")]


def refuse_pushes_and(queue, monkeypatch, refused: int) -> None:
    """The broker refuses every push, and a lone wake of member `refused`; the other lone wakes go."""
    def refuse(tasks):
        raise ConnectionError("the broker is away")
    monkeypatch.setattr(queue, "enqueue_many", refuse)
    real_one = queue.enqueue

    def one(task):
        if SignedPackage.loads(task)["args"][0] == refused:
            raise ConnectionError("refused")
        return real_one(task)
    monkeypatch.setattr(queue, "enqueue", one)


def test_a_push_that_fails_sends_each_wake_alone_and_names_those_refused(queue, tmp_path, monkeypatch):
    refuse_pushes_and(queue, monkeypatch, 32)
    owed = []
    monkeypatch.setattr(wakes, "owe_ring", owed.append)
    with wakes.one_push() as push:
        for member_id in (31, 32, 33):
            wakes.enqueue_wake(member_id, "message")
    assert push.failed == [32] and owed == [32]
    assert [t["args"][0] for t in queued(queue)] == [31, 33]


def test_the_embedded_push_is_one_transaction_and_one_ring(queue, monkeypatch, django_capture_on_commit_callbacks):
    if connection.vendor != "sqlite":
        pytest.skip("the ORM broker is embedded mode's")
    from veronica.plumbing import doorbell

    rings = []
    monkeypatch.setattr(doorbell, "ring_queue", lambda: rings.append(1))
    with CaptureQueriesContext(connection) as queries, django_capture_on_commit_callbacks(execute=True):
        with wakes.one_push():
            for member_id in range(41, 46):
                wakes.enqueue_wake(member_id, "message")
    inserts = [q["sql"] for q in queries if q["sql"].startswith("INSERT")]
    assert len(inserts) == 1 and rings == [1]
    assert [t["args"][0] for t in queued(queue)] == list(range(41, 46))


def test_a_long_push_goes_out_in_parts_as_it_fills(queue, monkeypatch):
    monkeypatch.setattr(wakes, "PUSH_MOST", 2)
    pushes = []
    real_many = queue.enqueue_many
    monkeypatch.setattr(queue, "enqueue_many", lambda tasks: (pushes.append(len(tasks)), real_many(tasks)))
    with wakes.one_push():
        for member_id in range(51, 54):
            wakes.enqueue_wake(member_id, "timer")
        assert pushes == [2], "the first two went when the push was full"
        for member_id in range(54, 56):
            wakes.enqueue_wake(member_id, "timer")
    assert pushes == [2, 2], "53 and 54 filled the second; 55, left alone at the end, went on its own"
    assert [t["args"][0] for t in queued(queue)] == list(range(51, 56))


def test_a_push_inside_another_sends_its_own_wakes_and_names_its_own_failures(queue, monkeypatch):
    """ring() inside a caller's push still learns which of its wakes were refused (to drop their flags),
    and the outer block's wakes still wait for its end."""
    refuse_pushes_and(queue, monkeypatch, 62)
    monkeypatch.setattr(wakes, "owe_ring", lambda member_id: None)
    with wakes.one_push() as outer:
        wakes.enqueue_wake(60, "message")
        with wakes.one_push() as inner:
            for member_id in (61, 62):
                wakes.enqueue_wake(member_id, "message")
        assert inner.failed == [62]
        assert [t["args"][0] for t in queued(queue)] == [61], "the inner block's went at its end"
    assert outer.failed == []
    assert [t["args"][0] for t in queued(queue)] == [61, 60]
