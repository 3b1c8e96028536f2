"""The writer lock: lease semantics, fencing, a crashed holder, and two processes racing a pass.

These run against the real test database (a file on SQLite, test_* on PostgreSQL) with committed
transactions, so the worker processes see the same rows."""
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from learning import api
from learning.lock import LeaseLost, LockBusy, WriterLock
from learning.models import MinedItem, PassRun, Reflection, WriterLease
from learning.sources import Correction, StaticSource

pytestmark = pytest.mark.django_db(transaction=True)


def test_lease_is_exclusive_and_released():
    a, b = WriterLock(ttl=30), WriterLock(ttl=30)
    assert a.try_acquire()
    assert not b.try_acquire()
    with pytest.raises(LockBusy):
        b.acquire(wait=0.3)
    a.renew()
    a.release()
    assert b.try_acquire()
    b.release()
    assert WriterLease.objects.get().holder == ""


def test_expired_lease_of_a_crashed_holder_is_taken_over():
    WriterLease.objects.create(name="store", holder="dead-process", holder_label="crashed pass",
                               acquired_at=timezone.now() - timedelta(hours=1),
                               expires_at=timezone.now() - timedelta(seconds=1))
    lock = WriterLock(ttl=30)
    lock.acquire(wait=0)
    assert WriterLease.objects.get().holder == lock.token
    lock.release()


def test_taken_over_holder_is_fenced_out():
    slow = WriterLock(ttl=0.2)
    slow.acquire(wait=0)
    time.sleep(0.3)  # stalls past its ttl (a hung model call)
    other = WriterLock(ttl=30)
    other.acquire(wait=0)
    with pytest.raises(LeaseLost):
        with slow.fence():
            MinedItem.objects.create(kind="correction", key="would-be-double")
    assert not MinedItem.objects.exists()  # the fenced write rolled back
    with pytest.raises(LeaseLost):
        slow.renew()
    slow.release()  # releasing a lost lease does not free the new holder's
    assert WriterLease.objects.get().holder == other.token
    other.release()


def test_pass_reports_busy_when_lock_is_held(source):
    holder = WriterLock(ttl=30)
    holder.acquire(wait=0)
    run = api.run_reflect(source, wait=0.2)
    assert run.status == "busy" and "held by" in run.errors[0]["error"]
    assert not MinedItem.objects.exists()
    holder.release()
    assert api.run_reflect(source, wait=0).status == "ok"


def test_crashed_process_never_wedges_the_lock(worker):
    run_worker, result = worker
    proc = run_worker("crash_holding_lock", 1.5)
    held = result(proc)
    assert proc.returncode == 3  # died without releasing
    assert WriterLease.objects.get().holder == held["held"]
    started = time.monotonic()
    run = api.run_reflect(StaticSource(correction_items=[Correction("c", ["ops"], "never do X")]), wait=20)
    assert run.status == "ok" and run.stats["mined_correction"] == 1
    assert time.monotonic() - started < 15


def test_two_processes_started_together_never_mine_the_same_item_twice(worker):
    run_worker, result = worker
    n = 12
    start_at = time.time() + 4
    procs = [run_worker("reflect", n, start_at, 0.05, 60) for _ in range(2)]
    results = [result(p) for p in procs]
    mined = [set(r["mined"]) for r in results]
    assert not (mined[0] & mined[1]), results
    assert mined[0] | mined[1] == {f"c{i}" for i in range(n)}
    assert MinedItem.objects.filter(kind="correction").count() == n
    assert Reflection.objects.count() == n
    assert sorted(r["status"] for r in results) == ["ok", "ok"]
    assert PassRun.objects.filter(kind="reflect").count() == 2


def test_two_processes_with_lease_takeover_still_mine_each_item_once(worker):
    """The first holder stalls in model calls longer than its lease; the second takes the lease over.
    The fence stops the first from writing what the second now owns."""
    run_worker, result = worker
    n = 4
    start_at = time.time() + 4
    procs = [run_worker("reflect", n, start_at, 0.6, 0.3) for _ in range(2)]
    results = [result(p) for p in procs]
    mined = [set(r["mined"]) for r in results]
    assert not (mined[0] & mined[1]), results
    assert mined[0] | mined[1] == {f"c{i}" for i in range(n)}
    assert MinedItem.objects.count() == n and Reflection.objects.count() == n
    # typically one pass is fenced out ("lost") and the other finishes; never a double mine
    assert {r["status"] for r in results} <= {"ok", "lost"} and "ok" in {r["status"] for r in results}


def test_prompt_block_cache_sees_another_process_write(worker):
    run_worker, result = worker
    api.add_user_rule("ops", "Here first.", actor="a")
    assert "Here first." in api.prompt_block(["ops"])  # cached now
    result(run_worker("add_user_rule", "ops", "Written by another process."))
    block = api.prompt_block(["ops"])
    assert "Written by another process." in block and "Here first." in block
