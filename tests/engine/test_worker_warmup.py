"""A django-q2 worker readies itself when it is spawned (veronica.engine.warm): the engine's modules are
imported, its connection is open and the claim's UPDATE is compiled before its first wake."""
from __future__ import annotations

import logging

import pytest
from django.db import OperationalError, connection
from django.utils import timezone
from django_q.signals import post_spawn

from veronica.swarm import bus
from veronica.engine import slot, warm
from veronica.models import Member, Run

pytestmark = pytest.mark.django_db


def test_the_spawn_signal_compiles_the_claim_and_claims_no_one(space, monkeypatch):
    bus.send(space, "boss", "w1", "work waiting: a claim of w1 would match")
    monkeypatch.setattr(slot, "_claim_sql", {})
    monkeypatch.setattr(slot, "_one_sql", {})
    post_spawn.send(sender="django_q", proc_name="Process-1")
    assert slot._claim_sql, "the claim's statement was not compiled"
    if connection.vendor == "postgresql":  # the wake's own shape: the claim with its Run row, member and session
        assert any(key[-1] is True for key in slot._one_sql), slot._one_sql.keys()
    assert connection.connection is not None
    assert not Member.objects.exclude(lease_token="").exists()  # nobody was claimed
    assert not Run.objects.exists()


def test_a_failed_warm_up_leaves_the_worker_to_start(monkeypatch, caplog):
    def down(*args, **kwargs):
        raise OperationalError("the database is down")

    monkeypatch.setattr(slot, "claim", down)
    with caplog.at_level(logging.WARNING, logger="veronica.engine.warm"):
        warm.warm_worker(proc_name="Process-1")
    assert "warm-up failed" in caplog.text


def test_a_hosts_pusher_fetches_no_wake_before_one_of_its_workers_is_warm(tmp_path, monkeypatch):
    """q2 forks the pusher last and it is ready at once, while a worker's warm-up took 7.5 s at load 8:
    wakes it fetched meanwhile (a resume pushed to the head of the list among them) waited on the
    warming workers, or died with the host. The pusher now waits for the host's ready note."""
    from veronica.engine import qbroker

    monkeypatch.setenv(warm.READY_ENV, str(tmp_path / "ready"))
    monkeypatch.setattr(warm, "READY_PAUSE", 0)
    fetched = []
    monkeypatch.setattr(qbroker.GatedRedis, "_take", lambda self: fetched.append(1) or [("ack", "task")])
    pusher = qbroker.GatedRedis.__new__(qbroker.GatedRedis)
    assert pusher.dequeue() is None and not fetched, "no worker of this host is warm: the wake stays in Redis"
    warm.warm_worker(proc_name="Process-1")
    assert pusher.dequeue() == [("ack", "task")], "a warm worker lets the pusher fetch"
    warm.clear_ready()  # (what the qcluster does at its start and its stop)
    assert pusher.dequeue() is None


def test_a_worker_whose_warm_up_failed_still_opens_the_door(tmp_path, monkeypatch):
    monkeypatch.setenv(warm.READY_ENV, str(tmp_path / "ready"))
    monkeypatch.setattr(slot, "claim", lambda *a, **k: (_ for _ in ()).throw(OperationalError("the database is down")))
    warm.warm_worker(proc_name="Process-1")
    assert warm.is_ready(), "its first wake pays the warm-up, as before the note: the host must not stop fetching for good"


def test_the_embedded_pusher_waits_for_a_warm_worker_too(tmp_path, monkeypatch):
    from veronica.engine import qbroker

    monkeypatch.setenv(warm.READY_ENV, str(tmp_path / "ready"))
    monkeypatch.setattr(warm, "READY_PAUSE", 0)
    pusher = qbroker.DoorbellORM.__new__(qbroker.DoorbellORM)
    monkeypatch.setattr(qbroker.DoorbellORM, "get_connection", lambda self: (_ for _ in ()).throw(AssertionError("fetched")))
    assert pusher.dequeue() is None


def test_without_a_qcluster_there_is_no_door_to_hold(monkeypatch):
    monkeypatch.delenv(warm.READY_ENV, raising=False)
    assert warm.is_ready() and warm.wait_until_ready()


def test_a_worker_host_starts_without_the_sdks_few_members_use():
    """A fresh worker host's start-up is what a kill's recovery waits on under load (bench/recovery.py:
    at load 8 a qcluster took ~18 s to take wakes). What every worker imports stays lean: the MCP
    SDK, a2a-sdk and daphne's Twisted load on first use, in the processes that use them."""
    import subprocess
    import sys

    code = ("import sys, django; django.setup(); from veronica.engine import warm; import importlib;"
            "[importlib.import_module(m) for m in warm.MODULES];"
            "print(sorted(n for n in ('mcp', 'mcp_types', 'a2a', 'twisted', 'autobahn') if n in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "DJANGO_SETTINGS_MODULE": "veronica.settings"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", f"a worker's start-up imports {out.stdout.strip()}"


def test_a_warming_worker_imports_the_sdks_of_the_models_its_members_use(space, monkeypatch):
    """The first model call of a worker imported its SDK under the import lock: in a burst, every run of
    the worker waited behind it. A warming worker imports the SDKs of the members' models and fallbacks,
    and only those (anthropic's alone is ~50 MB a worker)."""
    Member.objects.update(model="offline", fallback=[])
    assert warm.sdks_in_use() == ()
    Member.objects.filter(space=space, name="w1").update(model="openai:gpt-4.1-mini")
    assert warm.sdks_in_use() == ("openai",)
    Member.objects.filter(space=space, name="w2").update(fallback=["anthropic:claude-sonnet-4-5"])
    assert warm.sdks_in_use() == ("openai", "anthropic")
    Member.objects.filter(space=space, name="w2").update(removed_at=timezone.now())
    assert warm.sdks_in_use() == ("openai",), "a removed member's model is not imported"
    Member.objects.filter(space=space, name="w2").update(removed_at=None)
    imported = []
    monkeypatch.setattr(warm.importlib, "import_module", lambda name: imported.append(name))
    monkeypatch.setattr(slot, "claim", lambda *a, **k: None)
    warm.warm_worker(proc_name="Process-1")
    assert imported == [*warm.MODULES, "openai", "anthropic"]


def _settled(conn) -> None:
    import gc

    warm.settle_gc()
    conn.send((gc.get_threshold(), gc.get_freeze_count()))
    conn.close()


def test_a_forked_worker_freezes_what_it_imported_and_collects_young_objects_less_often():
    import gc
    import multiprocessing

    ctx = multiprocessing.get_context("fork")  # as q2's sentinel forks its workers
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=_settled, args=(theirs,))
    child.start()
    threshold, frozen = ours.recv()
    child.join(timeout=30)
    from veronica.plumbing import gcsettle

    assert threshold == gcsettle.THRESHOLD
    assert frozen > 10_000, "the imported stack was not frozen"
    # not a worker: this process's collector is left as it was
    before = gc.get_threshold(), gc.get_freeze_count()
    warm.settle_gc()
    assert (gc.get_threshold(), gc.get_freeze_count()) == before


def _child_signal(conn) -> None:
    import signal

    warm.reset_child_signal()
    conn.send(signal.getsignal(signal.SIGCHLD) is signal.SIG_DFL)
    conn.close()


def test_a_worker_forked_by_the_guarding_sentinel_drops_its_sigchld_handler():
    """The sentinel replaces a dead worker on SIGCHLD (veronica.engine.qguard); a worker it forks afterwards
    inherits that handler and must not run it for its own children's exits."""
    import multiprocessing
    import signal

    previous = signal.signal(signal.SIGCHLD, lambda *_: None)  # as the sentinel's guard has it
    try:
        ctx = multiprocessing.get_context("fork")
        ours, theirs = ctx.Pipe()
        child = ctx.Process(target=_child_signal, args=(theirs,))
        child.start()
        assert ours.recv() is True
        child.join(timeout=30)
        warm.reset_child_signal()  # not a forked worker: this process keeps its handler
        assert callable(signal.getsignal(signal.SIGCHLD))
    finally:
        signal.signal(signal.SIGCHLD, previous)


FIRST_RUN = """
import json, os, sys
import django
django.setup()
from veronica.engine import warm
warm.import_quietly(warm.MODULES + warm.SDKS, "")
warm.warm_prices()
before = set(sys.modules)
from veronica.engine import runner
outcome = runner.wake(int(sys.argv[1]), "message")
late = sorted(n for n in set(sys.modules) - before if n.split(".")[0] in ("veronica", "waggle", "learning", "genai_prices"))
print(json.dumps({"outcome": outcome, "late": late}))
"""


@pytest.mark.django_db(transaction=True)
def test_a_warmed_worker_s_first_run_imports_none_of_our_modules_late(tmp_path):
    """Each module a run imports on its first use is imported under the import lock, while every other
    run of the worker waits: the replacement of a killed worker, resuming 244 members at once, waited on
    waggle's modules and genai-prices' table. A worker warmed as warm_worker warms it (or forked from the
    sentinel's preload) has them all: its first run, through the real agent loop against the mock
    vendor, imports none of ours."""
    import json
    import subprocess
    import sys

    from tests.conftest import make_space
    from tests.harness import REPO, worker_env
    from tests.vendors.mock_openai import MockOpenAI

    space = make_space(tmp_path, workers=("w1",))
    Member.objects.filter(space=space, name="w1").update(model="openai:gpt-4.1-mini")
    bus.send(space, "boss", "w1", "list the folder, then say done")
    w1 = Member.objects.get(space=space, name="w1")
    with MockOpenAI(api_key="sk-warm") as mock:
        mock.configure(latency=0.0, steps=2)
        proc = subprocess.run([sys.executable, "-c", FIRST_RUN, str(w1.pk)], cwd=REPO, capture_output=True, text=True,
                              timeout=120, env=worker_env(OPENAI_BASE_URL=mock.base_url, OPENAI_API_KEY="sk-warm",
                                                          VERONICA_RUNS_PER_WORKER="1",
                                                          DJANGO_SETTINGS_MODULE="veronica.settings"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["outcome"] == "done", result
    assert result["late"] == [], f"a run imported these after the warm-up: {result['late']}"
