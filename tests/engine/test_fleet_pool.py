"""The run pool's heartbeat (veronica.engine.fleet), in process: one beat renews every lease the worker
holds in two statements, and a waiting run learns from it, without a statement of its own, that it
was asked to stop or lost its lease."""
from __future__ import annotations

import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from veronica.swarm import bus
from veronica.agent.runctx import Cancelled, LeaseLost
from veronica.engine import fleet, slot, supervisor, warm
from veronica.models import Member

pytestmark = pytest.mark.django_db


def claimed(space, *names: str) -> list[slot.RunLease]:
    leases = []
    for name in names:
        bus.send(space, "boss", name, "work")
        leases.append(slot.claim(supervisor.get_member(space, name).pk, "message"))
    return leases


def test_one_beat_renews_every_lease_of_the_process_in_two_statements(space):
    pool = fleet.RunPool(8, heartbeat=False)
    leases = claimed(space, "w1", "w2")
    for lease in leases:
        pool.register(lease)
    soon = timezone.now() + timedelta(seconds=2)
    Member.objects.filter(pk__in=[lease.member.pk for lease in leases]).update(lease_expires_at=soon)
    with CaptureQueriesContext(connection) as queries:
        pool.beat_once()
    assert len(queries) == 2
    assert all(e > soon + timedelta(seconds=30) for e in Member.objects.filter(
        pk__in=[lease.member.pk for lease in leases]).values_list("lease_expires_at", flat=True))
    with CaptureQueriesContext(connection) as queries:
        assert not any(lease.should_stop() for lease in leases)
    assert len(queries) == 0, "a waiting run renewed its own lease while the heartbeat beats"


def test_a_stop_and_a_lost_lease_reach_the_waiting_run_through_the_beat(space):
    pool = fleet.RunPool(8, heartbeat=False)
    stopped, lost = claimed(space, "w1", "w2")
    pool.register(stopped)
    pool.register(lost)
    Member.objects.filter(pk=stopped.member.pk).update(cancel_requested=True)
    Member.objects.filter(pk=lost.member.pk).update(lease_expires_at=Now() - timedelta(seconds=1))
    pool.beat_once()
    with CaptureQueriesContext(connection) as queries:
        assert stopped.should_stop() and lost.should_stop()
    assert len(queries) == 0
    assert isinstance(stopped.stop_reason(), Cancelled) and not isinstance(stopped.stop_reason(), LeaseLost)
    assert isinstance(lost.stop_reason(), LeaseLost)
    with pytest.raises(LeaseLost), lost.fenced():  # and its fence still refuses, as before
        pass


def test_a_spawn_signal_outside_a_clusters_worker_starts_no_run_pool(settings):
    settings.RUNS_PER_WORKER = 32
    warm.warm_worker(proc_name="Process-1")
    assert fleet.current() is None  # this (test) process is no child of a cluster: wakes run inline


def test_the_beat_does_not_renew_a_run_whose_thread_shows_no_life(space, settings):
    """A run hung in its thread (no step, no poll for a whole lease) is not kept alive by its neighbours'
    heartbeat: its lease runs out and the watchdog takes the member back, as when each run renewed its own."""
    settings.RUN_LEASE_SECONDS = 10
    pool = fleet.RunPool(8, heartbeat=False)
    alive, hung = claimed(space, "w1", "w2")
    pool.register(alive)
    pool.register(hung)
    hung.touched -= 11  # its thread last showed life eleven seconds ago, more than the lease
    soon = timezone.now() + timedelta(seconds=2)
    Member.objects.filter(pk__in=[alive.member.pk, hung.member.pk]).update(lease_expires_at=soon)
    pool.beat_once()
    assert Member.objects.get(pk=alive.member.pk).lease_expires_at > soon
    assert Member.objects.get(pk=hung.member.pk).lease_expires_at == soon


def test_a_pooled_model_call_polls_rarely_and_a_stop_the_beat_hears_aborts_it_at_once(space):
    """A run of a run pool waits on its model call with should_stop polled every half second, not 40
    times a second (a tenth of a pooled worker's CPU): the heartbeat pushes a stop it hears into the
    call's wait (sdk.interrupt), so the cancel still ends the call at once, not at the next poll."""

    from veronica.agent.providers import sdk
    from veronica.agent.providers.base import Cancelled as CallCancelled

    pool = fleet.RunPool(8, heartbeat=False)
    (lease,) = claimed(space, "w1")
    polls, ended = [0], {}

    def should_stop() -> bool:
        polls[0] += 1
        return lease.should_stop()

    def run() -> None:
        pool.register(lease)
        try:
            sdk.run_attempt(lambda emit, aborted: aborted.wait(30) and "late", should_stop=should_stop, on_event=None,
                            streamed=[0])
        except CallCancelled:
            ended["at"] = time.monotonic()
        finally:
            pool.unregister(lease)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 5
    while lease.thread is None and time.monotonic() < deadline:
        time.sleep(0.01)
    pool.beat_once()  # the lease is beating: the run's should_stop is a memory read from now on
    polls[0] = 0
    time.sleep(1.0)
    assert polls[0] <= 4, f"the waiting call polled should_stop {polls[0]} times in ~1 s"
    Member.objects.filter(pk=lease.member.pk).update(cancel_requested=True)
    asked = time.monotonic()
    pool.beat_once()
    thread.join(timeout=5)
    assert "at" in ended, "the model call was not aborted"
    assert ended["at"] - asked < 0.3, f"the abort took {ended['at'] - asked:.2f} s after the beat heard the stop"


@pytest.fixture
def full_pool(monkeypatch):
    """A worker's run pool with every slot taken, as the wake task meets it: the waits for a slot it
    made (their timeouts) and the wakes it handed back to the broker."""
    from veronica.engine import runner

    waits, sent = [], []

    class FullSlots:
        def acquire(self, blocking=True, timeout=None):
            if blocking:
                waits.append(timeout)
            return False

    pool = fleet.RunPool(1, heartbeat=False)
    pool._slots = FullSlots()
    monkeypatch.setattr(fleet, "_pool", pool)
    monkeypatch.setattr(runner.outage, "is_down", lambda: False)
    monkeypatch.setattr(runner, "BOUNCE_PAUSE", 0)
    monkeypatch.setattr(runner.wakes, "enqueue_wake", lambda *a, **k: sent.append((a, k)) or True)
    return SimpleNamespace(pool=pool, waits=waits, sent=sent)


def test_a_wake_a_full_pool_took_goes_back_to_the_broker_within_about_a_second(space, full_pool):
    """A full worker's task thread still takes one wake (it is free until it holds one). Waiting 30 s for
    a slot of its own (one frees only when a run ends) held that wake while the worker beside it had
    free slots: in bench/fleet.py one member of 500 started 15 s after the others and the fleet's
    completion was its. It goes back to the broker (at its head) within about a second instead."""
    from veronica.engine import runner

    w1 = supervisor.get_member(space, "w1")
    assert runner.wake(w1.pk, "message") == "handed-back"
    assert full_pool.sent == [((w1.pk, "message"), {"front": True, "owe": False})]
    assert full_pool.waits and full_pool.waits[0] <= 2, f"a full pool held the wake {full_pool.waits[0]} s"


def test_a_full_worker_hands_a_wake_back_at_once_when_another_worker_of_its_host_has_room(space, settings, tmp_path,
                                                                                         monkeypatch, full_pool):
    """A burst of 500 split 257/243 over two workers of 256 slots: the full one waited a second for a slot
    of its own before handing its 257th wake back, and the fleet's completion was that member's. While
    another worker of the host has room (fewer full notes than workers), the wake goes back at once; when
    every worker is full it waits for a slot of its own first, as before."""
    from veronica.engine import runner

    monkeypatch.setenv(warm.READY_ENV, str(tmp_path / "ready"))
    warm.note_full(True)  # this worker's note: its last slot is taken
    full_pool.pool.room_elsewhere = lambda: warm.room_elsewhere(settings.Q_WORKERS)  # as warm_worker has it
    w1 = supervisor.get_member(space, "w1")
    try:
        settings.Q_WORKERS = 2
        assert runner.wake(w1.pk, "message") == "handed-back"
        assert full_pool.sent == [((w1.pk, "message"), {"front": True, "owe": False})], "it was not handed back"
        assert full_pool.waits == [], "it waited for a slot here"
        settings.Q_WORKERS = 1  # this worker is the host's only one: it waits for a slot of its own first
        assert runner.wake(w1.pk, "message") == "handed-back"
        assert len(full_pool.waits) == 1
    finally:
        warm.note_full(False)


def test_the_heartbeat_keeps_a_connection_of_its_own_outside_the_pool(monkeypatch):
    """A beat drawn from the pool waited behind a burst of runs' writes; the runs, hearing no beat,
    renewed their own leases on the same pool, and a few hundred leases ran out with their runs alive
    (bench/fleet.py, 500 members woken at once). The heartbeat's thread opens its own connection."""

    from django.db import DEFAULT_DB_ALIAS, connections

    seen = {}

    def in_a_thread():
        conn = connections[DEFAULT_DB_ALIAS]
        conn.settings_dict = {**conn.settings_dict, "OPTIONS": {**conn.settings_dict["OPTIONS"], "pool": {"max_size": 8}}}
        fleet.dedicate_connection()
        seen["options"] = dict(connections[DEFAULT_DB_ALIAS].settings_dict["OPTIONS"])

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join(timeout=10)
    assert "pool" not in seen["options"], "the heartbeat's thread draws no connection from the pool"
    assert "pool" not in connections.settings[DEFAULT_DB_ALIAS]["OPTIONS"], "the other threads' settings are untouched"

    started = threading.Event()
    monkeypatch.setattr(fleet, "dedicate_connection", started.set)
    fleet.RunPool(1)  # its heartbeat thread (a daemon: with no lease to renew it only sleeps)
    assert started.wait(timeout=5), "the heartbeat thread dedicates its connection before it beats"


def _on_a_run_thread(pool, lease, fn):
    """fn() on a thread registered with the pool, as a pooled run's thread; its result or error."""

    box = {}

    def run() -> None:
        pool.register(lease)
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc
        finally:
            pool.unregister(lease)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, box


def test_a_pooled_call_runs_on_the_run_s_own_thread_only_while_the_heartbeat_beats(space):
    """The hand-off to a model-call thread (and its caller's polls) was ~6 % of a pooled worker's CPU: a run
    of a beating pool makes its call itself. Before the first beat, or with the beat lagging, nothing would
    push a stop into a call that polls nothing: the call goes to a helper, its caller polling."""

    from veronica.agent.providers import sdk

    pool = fleet.RunPool(8, heartbeat=False)
    (lease,) = claimed(space, "w1")

    def where():
        return [sdk.run_attempt(lambda emit, aborted: threading.current_thread(), should_stop=lease.should_stop,
                                on_event=None, streamed=[0]) is threading.current_thread()]

    thread, box = _on_a_run_thread(pool, lease, where)  # no beat yet
    thread.join(5)
    assert box == {"value": [False]}
    pool.beat_once()
    thread, box = _on_a_run_thread(pool, lease, where)
    thread.join(5)
    assert box == {"value": [True]}
    pool._beat_at -= 3 * 1.0 + 1  # the heartbeat lags three beats
    thread, box = _on_a_run_thread(pool, lease, where)
    thread.join(5)
    assert box == {"value": [False]}


@pytest.mark.parametrize("how", ["cancel", "lease lost"])
def test_an_inline_call_of_a_pooled_run_ends_at_the_beat_that_hears_the_stop(space, how):
    """The call polls nothing: the beat that reads the stop (or the lost lease) back interrupts it, and it
    ends within a fraction of a second, its socket shut down; until then the beat keeps renewing the lease
    of the run whose thread is in the call, however long ago it last polled."""
    from datetime import timedelta

    from django.db.models.functions import Now

    from veronica.agent.providers import sdk
    from veronica.agent.providers.base import Cancelled as CallCancelled
    from tests.vendors import faults as f
    from tests.vendors.mock_openai import MockOpenAI
    from veronica.agent.providers.openai_compat import OpenAIProvider

    pool = fleet.RunPool(8, heartbeat=False)
    (lease,) = claimed(space, "w1")
    pool.beat_once()
    texts = []
    with MockOpenAI() as mock:
        mock.push(f.generate(chunks=600, delay=0.05))
        provider = OpenAIProvider("model-x", mock.base_url, "test-key", sdk.CallConfig(timeout=30.0, max_retries=0))
        assert provider.client is not None
        thread, box = _on_a_run_thread(pool, lease, lambda: provider.complete(
            "SYS", [{"role": "user", "content": "go"}], [], should_stop=lease.should_stop, on_event=texts.append))
        deadline = time.monotonic() + 10
        while not (mock.model_requests() and mock.model_requests()[0].chunks_sent > 5) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sdk.calling(lease.thread) and texts
        lease.touched -= 3600  # no poll since: the call is its life
        soon = timezone.now() + timedelta(seconds=2)
        Member.objects.filter(pk=lease.member.pk).update(lease_expires_at=soon)
        pool.beat_once()
        assert Member.objects.get(pk=lease.member.pk).lease_expires_at > soon, "the beat left a calling run's lease"
        if how == "cancel":
            Member.objects.filter(pk=lease.member.pk).update(cancel_requested=True)
        else:
            Member.objects.filter(pk=lease.member.pk).update(lease_expires_at=Now() - timedelta(seconds=1))
        asked = time.monotonic()
        pool.beat_once()
        thread.join(5)
        ended = time.monotonic()
        record = mock.model_requests()[0]
        deadline = time.monotonic() + 2
        while record.disconnected_at is None and time.monotonic() < deadline:
            time.sleep(0.02)
    assert isinstance(box.get("error"), CallCancelled), box
    assert ended - asked < 0.5, f"the call ended {ended - asked:.2f} s after the beat heard the stop"
    assert record.disconnected_at is not None and record.chunks_sent < 600
    assert isinstance(lease.stop_reason(), LeaseLost) == (how == "lease lost")


def test_a_prestarted_pool_hands_wakes_to_its_waiting_threads_and_starts_none(monkeypatch):
    """A worker's pool starts its run threads as the worker warms: handing a wake over is a queue put, so the
    worker's main thread (the one taking q2's tasks) never waits for a new thread to get the GIL among the
    pool's busy runs (500 wakes at once started over seconds)."""

    pool = fleet.RunPool(4, heartbeat=False)
    pool.prestart()
    threads = {t for t in threading.enumerate() if t.name.startswith("run_")}
    assert len(threads) >= 4
    started = []
    monkeypatch.setattr(threading.Thread, "start", lambda self: started.append(self) or (_ for _ in ()).throw(
        AssertionError("a thread was started for a wake")))
    done = threading.Event()
    assert pool.reserve()
    pool.start(done.set, name="wake-1")
    assert done.wait(5) and started == []
    monkeypatch.undo()
    pool._threads.shutdown(wait=True)


def test_a_run_thread_starts_each_run_in_an_empty_context():
    """Run threads are reused: what one member's run set in a context variable (its audit actor, its tool stop,
    the engine clock's reading) must not be what the next run on that thread starts with."""
    import contextvars

    var = contextvars.ContextVar("test_run_context", default="unset")
    seen, done = [], threading.Semaphore(0)
    pool = fleet.RunPool(1, heartbeat=False)

    def first():
        var.set("member A")
        seen.append((threading.get_ident(), var.get()))
        done.release()

    def second():
        seen.append((threading.get_ident(), var.get()))
        done.release()

    for body in (first, second):
        assert pool.reserve()
        pool.start(body, name="wake")
        assert done.acquire(timeout=5)
    assert seen[0][0] == seen[1][0], "one thread ran both (a pool of one)"
    assert seen[1][1] == "unset"
    pool._threads.shutdown(wait=True)


def test_a_worker_process_that_ends_finishes_its_runs_first(tmp_path):
    """Run threads are not daemons: a worker that stops or is recycled (q2's worker function returns) finishes
    the runs its pool holds before the process exits, and its idle pre-started threads do not keep it alive."""
    import subprocess
    import sys
    import textwrap

    from bench._setup import REPO

    out = tmp_path / "finished"
    script = textwrap.dedent(f"""
        import multiprocessing, time
        def worker():
            import django
            django.setup()
            from veronica.engine import fleet
            pool = fleet.RunPool(8, heartbeat=False)
            pool.prestart()
            pool.reserve()
            pool.start(lambda: (time.sleep(0.5), open({str(out)!r}, "w").write("done")), name="wake-1")
        if __name__ == "__main__":
            p = multiprocessing.get_context("fork").Process(target=worker)
            p.start()
            p.join(30)
            raise SystemExit(0 if p.exitcode == 0 else 1)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, timeout=60, capture_output=True, text=True,
                          env={**__import__("os").environ, "DJANGO_SETTINGS_MODULE": "veronica.settings",
                               "VERONICA_DATA_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out.read_text() == "done"


def test_the_thread_that_went_idle_last_takes_the_next_run():
    """A worker with 256 slots and a few runs at a time keeps using a few threads (their stacks and per-thread
    state already there), not all 256 in turn: its RSS grew 6 % over 100,000 steps when a queue handed each
    run to the longest-idle thread (bench/fleet.py, worker memory)."""

    pool = fleet.RunPool(8, heartbeat=False)
    pool.prestart()
    used, done = set(), threading.Semaphore(0)

    def body():
        used.add(threading.get_ident())
        done.release()


    for _ in range(20):  # one run at a time
        assert pool.reserve()
        pool.start(body, name="wake")
        assert done.acquire(timeout=5)
        deadline = time.monotonic() + 5
        while len(pool._threads._idle) < 8 and time.monotonic() < deadline:  # its thread is back, waiting
            time.sleep(0.001)
    assert len(used) == 1
    pool._threads.shutdown(wait=True)


def test_a_run_let_in_while_every_thread_is_busy_waits_for_the_thread_on_its_way_back():
    """A run gives its slot back before its thread is idle again: a wake let in by that slot in between finds
    no idle thread, and must wait for that one (not fail: its wake would wait for the unread sweep)."""

    threads = fleet.RunThreads(1)
    first_may_end, ran = threading.Event(), threading.Event()
    threads.submit(lambda: first_may_end.wait(5))
    errors = []

    def second():
        try:
            threads.submit(ran.set)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    submitter = threading.Thread(target=second)
    submitter.start()

    time.sleep(0.2)  # the second submit is in while the only thread is busy
    first_may_end.set()
    submitter.join(5)
    assert errors == [] and ran.wait(5)
    threads.shutdown(wait=True)


def test_a_worker_starts_the_wakes_of_a_bundle_it_has_room_for_and_hands_the_rest_back_in_their_order(space, settings,
                                                                                                     monkeypatch):
    """runner.wake_all, the task of several wakes the pusher fetched together (veronica.engine.qbroker):
    each takes a run slot of the pool; those the worker has no room for go back to the broker's head at
    once, in order (one pause, not one per wake), and all of them when the host is cut off."""
    from veronica.engine import runner

    pool = fleet.RunPool(3, heartbeat=False)  # the host's only worker: no room elsewhere
    monkeypatch.setattr(fleet, "_pool", pool)
    monkeypatch.setattr(fleet.RunPool, "reserve", lambda self: False)  # no slot frees while the worker waits
    ran, sent, pauses = [], [], []
    release = threading.Event()

    def run(pool_, member_id, source):
        ran.append((member_id, source))
        release.wait(10)

    monkeypatch.setattr(runner, "claim_and_run", run)
    monkeypatch.setattr(runner.outage, "is_down", lambda: False)
    monkeypatch.setattr(runner, "time", SimpleNamespace(sleep=pauses.append))
    monkeypatch.setattr(runner.wakes, "enqueue_wake", lambda *a, **k: sent.append((a, k)) or True)
    bundle = [(10, "message"), (11, "timer"), (12, "message"), (13, "resume"), (14, "message")]
    try:
        assert runner.wake_all(bundle) == "pooled 3, handed back 2"
        release.set()
        deadline = time.monotonic() + 5
        while pool._free < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(ran) == bundle[:3]
        # pushed to the head last to first: the list's head reads 13, then 14
        assert sent == [((14, "message"), {"front": True, "owe": False}), ((13, "resume"), {"front": True, "owe": False})]
        assert pauses == [runner.BOUNCE_PAUSE]
        sent.clear()
        monkeypatch.setattr(runner.outage, "is_down", lambda: True)
        assert runner.wake_all(bundle[:2]) == "pooled 0, handed back 2"
        assert [a for a, _ in sent] == [(11, "timer"), (10, "message")]
    finally:
        release.set()
        pool._threads.shutdown()
