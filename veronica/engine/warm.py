"""A django-q2 worker readies itself when it is spawned, not on its first wake.

A fresh worker's first task paid, on the path from a commit to its run: importing the engine and
the agent (q2 imports a task's module on first use), opening its database connection, and the ORM
compiling the claim's UPDATE. That was every p99 outlier of the hosted wake (≈ 55 ms against ≈ 9 ms
warm, once per worker, again after each recycle). q2's post_spawn signal runs in the worker before
it reads the task queue, while the other workers take the tasks.
"""
from __future__ import annotations

import importlib
import logging
import multiprocessing
import os
import signal
import time

from veronica.plumbing import gcsettle

log = logging.getLogger(__name__)

# What a wake and a run import on first use; the providers' SDKs come with their modules.
MODULES = (
    "veronica.engine.runner",
    "veronica.engine.qbroker",
    "veronica.agent.loop",
    "veronica.agent.providers.offline",
    "veronica.agent.providers.openai_compat",
    "veronica.agent.providers.anthropic",
    "veronica.agent.providers.limits",
    "veronica.agent.providers.pricing",
    # What a run's first steps imported late, each under the import lock among the worker's runs: in the
    # replacement of a killed worker, 244 resumes at once waited on waggle's modules (~0.25 s of imports)
    # and on genai-prices' table (0.16 s to import, 16 ms to load on its first lookup; pricing.warm).
    "waggle.service",
    "genai_prices",
)
# The vendors' SDKs, which the provider modules import on a run's first model call.
SDKS = ("openai", "anthropic")
NO_MEMBER = 0  # ids start at 1: the claim compiles, runs and matches no row

# The host's "a worker is ready" note, shared by its qcluster's processes like the outage note
# (veronica.engine.outage): `manage.py qcluster` names a file here before q2 forks, a worker writes it
# once warm, and the pusher fetches no wake before it stands. q2 forks the pusher last and it is
# ready at once, while each worker still imports the agent stack and the vendors' SDKs: 7.5 s at
# load 8 on two cores, during which the pusher held wakes nobody here could take (a resume pushed
# to the head of Redis's list among them), lost with the host if it died meanwhile. Without the
# variable (no qcluster: tests, a shell) there is no pusher to hold back.
READY_ENV = "VERONICA_WORKER_READY_MARK"
READY_PAUSE = 0.1  # how often a pusher waiting on its workers looks again


def mark_ready() -> None:
    path = os.environ.get(READY_ENV, "")
    if path and not os.path.exists(path):
        try:
            open(path, "a").close()
        except OSError:  # an unwritable temp dir: fetch at once, as before the note
            os.environ.pop(READY_ENV, None)


def clear_ready() -> None:
    path = os.environ.get(READY_ENV, "")
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass
        for name in _full_notes(path):  # (the workers' "full" notes go with it)
            _drop_full_note(path, name)


def is_ready() -> bool:
    path = os.environ.get(READY_ENV, "")
    return not path or os.path.exists(path)


# A worker's "every run slot of mine is taken" note (veronica.engine.fleet), one file per worker in a
# folder beside the ready note: while every worker of the host has one up, its pusher fetches nothing.
# A wake fetched then reached a worker that waited SLOT_WAIT_SECONDS for a slot and handed it back to
# Redis, while a host with free slots could have run it at once; and the pusher now takes a burst's
# wakes several at a time (veronica.engine.qbroker), so a full host would hold more of them.
FULL_PAUSE = 0.05  # how often a pusher whose workers are all full looks again


def note_full(full: bool) -> None:
    """Put this worker's full note up (its last free run slot was just taken) or take it down (one freed)."""
    path = os.environ.get(READY_ENV, "")
    if not path:
        return
    if not full:
        _drop_full_note(path, _note_name())
        return
    try:
        os.makedirs(path + ".full", exist_ok=True)
        open(os.path.join(path + ".full", _note_name()), "a").close()
    except OSError:  # an unwritable temp dir: the pusher fetches as it did before the note
        pass


def _note_name() -> str:
    """This process's mark (veronica.engine.holders: its pid and start time, so a reused pid is another
    process), or its bare pid where the machine cannot tell its start."""
    from veronica.engine import holders

    return holders.process_mark() or str(os.getpid())


def host_full(workers: int) -> bool:
    """Every one of the host's `workers` worker processes has its full note up. The note of a worker that
    died (SIGKILLed with its pool full) is dropped here: its replacement starts with free slots."""
    path = os.environ.get(READY_ENV, "")
    if not path:
        return False
    names = _full_notes(path)
    if len(names) < workers:
        return False
    live = 0
    for name in names:
        if _running(name):
            live += 1
        else:
            _drop_full_note(path, name)
    return live >= workers


def room_elsewhere(workers: int) -> bool:
    """Another of the host's `workers` worker processes has a free run slot (fewer full notes than
    workers). False where no qcluster keeps the notes: nothing is known of other workers there."""
    return bool(os.environ.get(READY_ENV, "")) and not host_full(workers)


def _full_notes(path: str) -> list[str]:
    try:
        return os.listdir(path + ".full")
    except OSError:
        return []


def _drop_full_note(path: str, name: str) -> None:
    try:
        os.unlink(os.path.join(path + ".full", name))
    except OSError:
        pass


def _running(name: str) -> bool:
    """The worker of this note still runs (a mark whose process is gone, or a reused pid, does not)."""
    from veronica.engine import holders

    if not name.isdigit():
        return not holders.mark_gone(name, name.split(".")[0])
    try:
        os.kill(int(name), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process, but it runs
        return True
    return True


def wait_until_ready() -> bool:
    """The pusher's gate (veronica.engine.qbroker): False, after a short pause, while no worker of
    this host is warm, so the caller fetches nothing yet."""
    if is_ready():
        return True
    time.sleep(READY_PAUSE)
    return False


def sdks_in_use() -> tuple[str, ...]:
    """The vendors' SDKs of the models the members use (their own and their fallbacks), for a worker to
    import as it warms. The first workers are forked before the sentinel preloads (preload), and each
    imported its SDK on its first model call, under the import lock: in a burst of 500 members every run
    of the worker waited behind it (openai: 0.3 s of CPU alone, about a second of the GIL among the
    burst's claims; the profile of a worker in bench/fleet.py's first 2.5 s was 40 % pydantic building
    the SDK's types). Only those in use: anthropic alone is ~50 MB and 1 s a worker. A model set later is
    imported by its first call, as before. One query."""
    from veronica.agent.providers import split_spec
    from veronica.models import Member

    kinds = set()
    for model, fallback in Member.objects.filter(removed_at__isnull=True).order_by().values_list("model", "fallback").distinct():
        for spec in [model, *(fallback if isinstance(fallback, list) else [])]:
            kinds.add(split_spec(spec if isinstance(spec, str) else "")[0])
    return tuple(sdk for sdk in SDKS if sdk in kinds)


def import_quietly(names, when: str) -> None:
    """Import each module named; one that fails (an SDK not installed, or broken) is logged and left
    for its provider's own import to report."""
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:
            log.info("could not import %s %s", name, when, exc_info=True)


def warm_prices() -> None:
    """genai-prices reads its table on its first lookup (~16 ms, under the GIL every run of a burst
    waits for): read here, best effort."""
    try:
        from veronica.agent.providers import pricing

        pricing.warm()
    except Exception:
        log.info("could not load the price table", exc_info=True)


def preload() -> None:
    """In q2's sentinel, once it has forked the cluster (veronica.engine.qguard): the agent stack and the
    vendors' SDKs, so a worker it forks later (for one that died or was recycled) inherits them, shared,
    instead of importing them itself. A worker killed mid-fleet is replaced by one that reaps its
    predecessor's runs and resumes them all at once: their first model calls imported the SDK (~0.3 s
    of the GIL, openai), in the middle of that burst. Best effort: a worker imports what is missing.
    Then the sentinel's collector is settled: the frozen heap is inherited too, so such a worker's own
    settle (settle_gc, between its reap and its resumes) walks only what it made itself."""
    import_quietly(MODULES + SDKS, "as the sentinel preloads")
    warm_prices()
    gcsettle.settle()


def warm_worker(**_) -> None:
    """post_spawn receiver: the worker's run pool (veronica.engine.fleet), then the warm-up. Best effort: a worker that cannot warm up (the database down at spawn)
    still starts, and its first wake pays the cost as before."""
    from django.conf import settings
    from django.db import connections

    from veronica.engine import fleet

    started = time.monotonic()
    reset_child_signal()
    # this worker's run pool (and its connection pool), before it reads a task
    pool = fleet.enable(on_full=note_full, room_elsewhere=lambda: room_elsewhere(settings.Q_WORKERS))
    try:
        for name in MODULES:
            importlib.import_module(name)
        import_quietly(sdks_in_use(), "as the worker warms")
        warm_prices()
        from veronica.engine import slot
        from veronica.engine.runner import MAIL_SOURCES

        for source in MAIL_SOURCES[:1] + ("timer",):
            slot.claim(NO_MEMBER, source, gates=("breaker", "mail") if source in MAIL_SOURCES else ("breaker",),
                       open_session=True)  # the shape a wake's claim has (veronica.engine.runner)
        log.info("worker warmed up in %.2fs", time.monotonic() - started)
    except Exception:
        log.warning("worker warm-up failed; its first wake will warm it", exc_info=True)
        connections.close_all()  # a broken connection is not handed to the first task
    resumes: list[int] = []
    try:  # a worker of this machine that died (this one's predecessor, a killed host restarted): its runs now
        from veronica.engine import holders

        # With a run pool, this worker starts their resumes itself (runner.resume_here), not via the broker.
        resumes = holders.reap_dead_here(ring_now=pool is None)
    except Exception:
        log.warning("could not look for leases of dead processes of this machine; their leases run out", exc_info=True)
        connections.close_all()
    settle_gc()
    mark_ready()  # warm or not, this worker takes wakes now
    if resumes and pool is not None:  # (without one the reap rang them through the broker)
        from veronica.engine.runner import resume_here

        try:
            resume_here(pool, resumes)
        except Exception:  # owed all the same: the engine tick rings them within ring_again_seconds
            log.warning("could not start the reaped members' resumes; the engine tick rings them", exc_info=True)


def reset_child_signal() -> None:
    """A worker the sentinel forks once its guard runs (a replacement, a recycle) inherits the sentinel's
    SIGCHLD handler (veronica.engine.qguard): the exits of a worker's own children (sandboxed commands, MCP
    servers) are none of its business."""
    if multiprocessing.parent_process() is not None and callable(signal.getsignal(signal.SIGCHLD)):
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def settle_gc() -> None:
    """The worker's collector, once it is warm (veronica.plumbing.gcsettle): a run pool of hundreds of
    runs allocated past CPython's young threshold every few hundred microseconds, and each full pass
    walked everything the worker had imported (~120 ms, three times in a 500-member burst): ~7 % of a
    pooled worker's CPU (bench/fleet.py). A worker forked by a cluster only: a test calling
    warm_worker keeps its own process's collector."""
    if multiprocessing.parent_process() is None:
        return
    gcsettle.settle()
