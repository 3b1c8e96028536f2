"""How a host's pusher fetches wakes (veronica.engine.qbroker): a burst several at a time, and nothing
while every worker of the host has all its run slots taken (veronica.engine.warm's full notes, put up
and taken down by each worker's run pool, veronica.engine.fleet)."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid

import pytest
from django.conf import settings
from django_q.conf import Conf

from veronica.engine import fleet, holders, qbroker, warm
from veronica.plumbing import procstat

needs_redis = pytest.mark.skipif(not settings.REDIS_URL, reason="the Redis broker is hosted mode's")


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A qcluster's notes in a folder of the test's own, its workers warm."""
    monkeypatch.setenv(warm.READY_ENV, str(tmp_path / "ready"))
    monkeypatch.setattr(warm, "FULL_PAUSE", 0)
    warm.mark_ready()
    yield tmp_path / "ready"
    warm.clear_ready()


@pytest.fixture
def redis_list():
    """A GatedRedis on a list of its own (the test's Redis, a unique key), emptied on the way out."""
    broker = qbroker.GatedRedis(list_key=f"test-fetch-{uuid.uuid4().hex}")
    yield broker
    broker.connection.delete(broker.list_key)


def full_notes(path) -> list[str]:
    try:
        return sorted(os.listdir(f"{path}.full"))
    except FileNotFoundError:
        return []


def counting(monkeypatch, connection, *commands: str) -> list[str]:
    sent: list[str] = []
    for name in commands:
        real = getattr(connection, name)
        monkeypatch.setattr(connection, name, lambda *a, _real=real, _name=name, **k: sent.append(_name) or _real(*a, **k))
    return sent


@needs_redis
def test_a_burst_of_wakes_is_fetched_in_one_round_trip_and_handed_over_one_at_a_time_in_its_order(host, redis_list,
                                                                                                     monkeypatch):
    """q2's dequeue is one BLPOP per wake: the pusher's round trip to Redis sat between every two wakes
    its workers took, and 500 wakes reached two workers over 1.5-2.5 s (bench/fleet.py)."""
    tasks = [f"wake-{n}".encode() for n in range(qbroker.TAKE_AT_ONCE + 8)]
    redis_list.connection.rpush(redis_list.list_key, *tasks)
    sent = counting(monkeypatch, redis_list.connection, "blpop", "lpop")
    handed = []
    for _ in range(qbroker.TAKE_AT_ONCE):
        handed += redis_list.dequeue()
    assert [task for _, task in handed] == tasks[:qbroker.TAKE_AT_ONCE] and sent == ["blpop", "lpop"]
    for _ in range(8):
        handed += redis_list.dequeue()
    assert [task for _, task in handed] == tasks and sent == ["blpop", "lpop"] * 2, "the rest, at the next fetch"
    assert redis_list.connection.llen(redis_list.list_key) == 0


@needs_redis
def test_a_host_that_fills_up_or_is_cut_off_gives_its_hand_back_to_the_head_of_the_list(host, redis_list, monkeypatch):
    from veronica.engine import outage

    monkeypatch.setattr(Conf, "WORKERS", 1)
    redis_list.connection.rpush(redis_list.list_key, b"a", b"b", b"c")
    assert redis_list.dequeue() == [(None, b"a")]
    redis_list.connection.rpush(redis_list.list_key, b"later")
    warm.note_full(True)  # this process stands for the host's one worker: its last run slot was taken
    assert redis_list.dequeue() is None
    assert redis_list.connection.lrange(redis_list.list_key, 0, -1) == [b"b", b"c", b"later"], \
        "the wakes in hand are back where they were, for a host with room"
    warm.note_full(False)
    assert redis_list.dequeue() == [(None, b"b")]
    monkeypatch.setenv(outage.MARK_ENV, str(host) + ".outage")
    monkeypatch.setattr(outage, "network_database", lambda: True)
    monkeypatch.setattr(qbroker, "GATE_PAUSE", 0)
    outage.mark_down()
    try:
        assert redis_list.dequeue() is None
    finally:
        outage.mark_up()
    assert redis_list.connection.lrange(redis_list.list_key, 0, -1) == [b"c", b"later"]


@needs_redis
def test_a_stopping_pusher_gives_its_hand_back(host, redis_list):
    """q2's pusher ends its loop when the cluster stops; the wakes it fetched but did not hand over yet
    go back to the list (veronica.engine.qguard.push_then_give_back), for the workers left."""
    import multiprocessing

    from django_q.signing import SignedPackage

    from veronica.engine import qguard

    a, b, c = (SignedPackage.dumps({"name": name, "func": "print", "args": (), "kwargs": {}}).encode() for name in "abc")
    redis_list.connection.rpush(redis_list.list_key, a, b, c)
    stop = multiprocessing.Event()
    taken = []

    class OneSlot:
        def put(self, task):  # a worker takes the first wake; then the cluster stops
            taken.append(task["name"])
            stop.set()

    qguard.push_then_give_back(OneSlot(), stop, redis_list)
    assert taken == ["a"]
    assert redis_list.connection.lrange(redis_list.list_key, 0, -1) == [b, c]


@needs_redis
def test_a_lone_wake_is_fetched_alone_and_a_server_without_a_counted_lpop_still_delivers(host, redis_list, monkeypatch):
    import redis

    monkeypatch.setattr(qbroker.GatedRedis, "_counted", True)  # (restored after: the fallback is remembered per process)
    redis_list.connection.rpush(redis_list.list_key, b"alone")
    assert redis_list.dequeue() == [(None, b"alone")]
    redis_list.connection.rpush(redis_list.list_key, b"one", b"two")

    def refused(*args, **kwargs):
        raise redis.ResponseError("wrong number of arguments for 'lpop' command")

    monkeypatch.setattr(redis_list.connection, "lpop", refused)
    assert redis_list.dequeue() == [(None, b"one")]
    assert redis_list.dequeue() == [(None, b"two")], "one wake per fetch, as q2 fetches, on a server before Redis 6.2"
    assert qbroker.GatedRedis._counted is False


def test_a_run_pool_puts_its_full_note_up_with_its_last_slot_and_down_when_one_frees(host):
    pool = fleet.RunPool(2, heartbeat=False, on_full=warm.note_full)
    try:
        assert pool.reserve() and full_notes(host) == []
        assert pool.try_reserve() and full_notes(host) == [holders.process_mark()], "the last free slot was taken"
        assert not pool.try_reserve()
        done = threading.Event()
        pool.start(done.set, name="one-run")
        done.wait(5)
        deadline = time.monotonic() + 5
        while full_notes(host) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert full_notes(host) == [], "a run ended and gave its slot back: the note came down"
    finally:
        pool._threads.shutdown()


@pytest.mark.django_db
def test_a_spawning_worker_gives_its_run_pool_the_full_note_and_the_host_s_others(host, monkeypatch, settings):
    given = {}
    monkeypatch.setattr(fleet, "enable", lambda **kwargs: given.update(kwargs))
    warm.warm_worker(proc_name="Process-1")
    assert given.pop("on_full") is warm.note_full
    room_elsewhere = given.pop("room_elsewhere")
    assert not given
    settings.Q_WORKERS = 2
    warm.note_full(True)  # this worker is full, the host's other one is not
    assert room_elsewhere()
    settings.Q_WORKERS = 1
    assert not room_elsewhere()
    warm.note_full(False)


def test_the_full_note_follows_the_slots_however_their_takes_and_returns_interleave(host):
    """The note is put up and taken down in the order the count moved: a note left up beside a free slot
    would keep the pusher from fetching for a worker that has room."""
    pool = fleet.RunPool(3, heartbeat=False, on_full=warm.note_full)
    try:
        def churn() -> None:
            for _ in range(200):
                if pool.try_reserve():
                    pool.start(lambda: None, name="churn")

        threads = [threading.Thread(target=churn) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        deadline = time.monotonic() + 5
        while pool._free < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool._free == 3
        assert full_notes(host) == [], "every slot is free again, and the note is down"
    finally:
        pool._threads.shutdown()


def test_a_host_whose_workers_are_all_full_fetches_nothing_until_one_has_room(host, monkeypatch):
    monkeypatch.setattr(Conf, "WORKERS", 2)
    fetched = []
    monkeypatch.setattr(qbroker.GatedRedis, "_take", lambda self: fetched.append(1) or [(None, b"task")])
    pusher = qbroker.GatedRedis.__new__(qbroker.GatedRedis)
    sibling = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        warm.note_full(True)  # this process stands for one worker, the sibling for the other
        machine = holders.process_mark().split(".")[0]
        with open(os.path.join(f"{host}.full", f"{machine}.{sibling.pid:x}.{procstat.stat(sibling.pid).start:x}"), "w"):
            pass
        assert pusher.dequeue() is None and not fetched, "every worker is full: the wakes stay in Redis"
        warm.note_full(False)
        assert pusher.dequeue() == [(None, b"task")], "a slot freed: the pusher fetches again"
        warm.note_full(True)
        assert pusher.dequeue() is None
        sibling.kill()
        sibling.wait()
        assert pusher.dequeue() == [(None, b"task")], "a dead worker's note does not hold the host back"
        assert full_notes(host) == [holders.process_mark()], "and it was cleared"
    finally:
        sibling.kill()
        sibling.wait()


def test_the_embedded_pusher_waits_for_a_worker_with_room_too(host, monkeypatch):
    monkeypatch.setattr(Conf, "WORKERS", 1)
    warm.note_full(True)
    pusher = qbroker.DoorbellORM.__new__(qbroker.DoorbellORM)
    monkeypatch.setattr(qbroker.DoorbellORM, "get_connection", lambda self: (_ for _ in ()).throw(AssertionError("fetched")))
    assert pusher.dequeue() is None


def test_a_note_whose_pid_was_reused_by_another_process_does_not_hold_the_host_back(host, monkeypatch):
    monkeypatch.setattr(Conf, "WORKERS", 1)
    machine, pid, start = holders.process_mark().split(".")
    os.makedirs(f"{host}.full", exist_ok=True)
    stale = f"{machine}.{pid}.{int(start, 16) - 1:x}"  # this pid, when another process had it
    with open(os.path.join(f"{host}.full", stale), "w"):
        pass
    assert not warm.host_full(1) and full_notes(host) == []
    warm.note_full(True)
    assert warm.host_full(1)


def test_the_qcluster_clears_its_workers_full_notes_with_its_ready_note(host):
    warm.note_full(True)
    warm.clear_ready()
    assert full_notes(host) == [] and not warm.host_full(1)


def _queued(broker, func: str, *args) -> None:
    from django_q.tasks import async_task

    async_task(func, *args, q_options={"broker": broker, "save": False, "task_name": f"{func}-{args}"})


def _task(package) -> dict:
    from django_q.signing import SignedPackage

    return SignedPackage.loads(package)


@needs_redis
def test_the_wakes_at_the_head_of_a_fetch_go_to_a_worker_in_one_task_and_any_other_task_alone_in_its_place(
        host, redis_list, settings):
    """One q2 task per wake: each went from the pusher to a worker's task thread through q2's one-place
    queue, and 500 wakes reached two busy workers over 1.4-1.7 s (bench/fleet.py). The wakes at the hand's
    head go together, up to BUNDLE_MOST, as one task of runner.wake_all; another task breaks the bundle."""
    settings.RUNS_PER_WORKER = 8
    for n in range(qbroker.BUNDLE_MOST + 4):
        _queued(redis_list, qbroker.WAKE_FUNC, n, "message")
    _queued(redis_list, "math.floor", 1.5)
    _queued(redis_list, qbroker.WAKE_FUNC, 100, "resume")
    _queued(redis_list, qbroker.WAKE_FUNC, 101, "timer")
    handed = [_task(redis_list.dequeue()[0][1]) for _ in range(4)]
    assert [task["func"] for task in handed] == [qbroker.BUNDLE_FUNC, qbroker.BUNDLE_FUNC, "math.floor", qbroker.BUNDLE_FUNC]
    assert handed[0]["args"] == ([(n, "message") for n in range(qbroker.BUNDLE_MOST)],)
    assert handed[1]["args"] == ([(n, "message") for n in range(qbroker.BUNDLE_MOST, qbroker.BUNDLE_MOST + 4)],)
    assert handed[2]["args"] == (1.5,)
    assert handed[3]["args"] == ([(100, "resume"), (101, "timer")],)
    assert all(task["save"] is False for task in handed), "a wake's task leaves no result row, bundled or not"
    assert redis_list.dequeue() is None


@needs_redis
def test_a_lone_wake_and_the_wakes_of_workers_without_run_pools_go_one_task_each(host, redis_list, settings):
    settings.RUNS_PER_WORKER = 8
    _queued(redis_list, qbroker.WAKE_FUNC, 1, "message")
    assert _task(redis_list.dequeue()[0][1])["func"] == qbroker.WAKE_FUNC
    settings.RUNS_PER_WORKER = 1  # a run holds its worker: each wake is a worker's own task
    _queued(redis_list, qbroker.WAKE_FUNC, 2, "message")
    _queued(redis_list, qbroker.WAKE_FUNC, 3, "message")
    assert [_task(redis_list.dequeue()[0][1])["args"] for _ in range(2)] == [(2, "message"), (3, "message")]


# --- the embedded queue (DoorbellORM): the same hand, over the queue table's rows ------------------------------

@pytest.fixture
def orm_queue(db, monkeypatch):
    """A DoorbellORM on a queue name of its own, in this test's database (either mode's: it is a table)."""
    monkeypatch.setattr(Conf, "ORM", "default")
    monkeypatch.setattr(qbroker.DoorbellORM, "_wait", lambda self, timeout: None)
    return qbroker.DoorbellORM(list_key=f"test-fetch-{uuid.uuid4().hex}")


def _rows(broker) -> list:
    from django_q.models import OrmQ

    return list(OrmQ.objects.filter(key=broker.list_key).order_by("id").values_list("id", flat=True))


def _due(broker) -> list:
    from django.utils import timezone
    from django_q.models import OrmQ

    return list(OrmQ.objects.filter(key=broker.list_key, lock__lte=timezone.now()).order_by("id").values_list("id", flat=True))


def test_the_embedded_pusher_hands_a_burst_over_a_bundle_at_a_time_and_its_ack_takes_every_wake_s_row(
        host, orm_queue, settings):
    """It handed q2 the whole fetch (32 wakes) at once: each went through q2's one-place queue to a worker
    that, full by then, held it a second before handing it back; with a worker per host 29 members woke
    16 s late (bench/fleet.py, embedded, a host killed meanwhile)."""
    settings.RUNS_PER_WORKER = 8
    for n in range(qbroker.BUNDLE_MOST + 3):
        _queued(orm_queue, qbroker.WAKE_FUNC, n, "message")
    rows = _rows(orm_queue)
    first = orm_queue.dequeue()
    assert len(first) == 1 and _due(orm_queue) == [], "one statement locked the burst; q2 got one task of it"
    ack, package = first[0]
    assert _task(package)["args"] == ([(n, "message") for n in range(qbroker.BUNDLE_MOST)],)
    assert ack == tuple(rows[:qbroker.BUNDLE_MOST])
    orm_queue.acknowledge(ack)
    assert _rows(orm_queue) == rows[qbroker.BUNDLE_MOST:], "the bundle's ack deleted every row it carried"
    ack, package = orm_queue.dequeue()[0]
    assert ack == tuple(rows[qbroker.BUNDLE_MOST:]) and len(_task(package)["args"][0]) == 3
    orm_queue.fail(ack)
    assert _rows(orm_queue) == [] and orm_queue.dequeue() is None


def test_an_embedded_host_that_fills_up_or_stops_makes_the_wakes_in_its_hand_due_again(host, orm_queue, settings,
                                                                                       monkeypatch):
    from veronica.engine import qguard

    settings.RUNS_PER_WORKER = 1  # one task per wake, so the hand keeps some
    monkeypatch.setattr(Conf, "WORKERS", 1)
    for n in range(4):
        _queued(orm_queue, qbroker.WAKE_FUNC, n, "message")
    rows = _rows(orm_queue)
    assert orm_queue.dequeue()[0][0] == rows[0] and _due(orm_queue) == []
    warm.note_full(True)  # this process stands for the host's one worker: its last run slot was taken
    assert orm_queue.dequeue() is None
    assert _due(orm_queue) == rows[1:], "the wakes in hand are due again, for a host with room, in their place"
    warm.note_full(False)
    assert orm_queue.dequeue()[0][0] == rows[1]

    import multiprocessing

    stop = multiprocessing.Event()

    class OneSlot:
        def put(self, task):  # a worker takes the next wake; then the cluster stops
            stop.set()

    qguard.push_then_give_back(OneSlot(), stop, orm_queue)
    assert _due(orm_queue) == rows[3:], "the stopping pusher's hand is due again"
