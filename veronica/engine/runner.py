"""The wake task: claim the slot, run the agent, finish under the lease.

A wake claims the member with one conditional UPDATE (veronica.engine.slot). No claim, no run: the
run in flight drains the mailbox and re-checks for unread work when it ends; a parked member or one
waiting out a backoff is not claimed at all. The engine calls the agent runtime (never the reverse):
the run sees the slot only through the RunContext protocol of veronica.agent.runctx.
"""
from __future__ import annotations

import logging
import time

from django.db import InterfaceError, OperationalError, connections
from django.db.models import Exists, OuterRef

from veronica.swarm import audit
from veronica.ops import tracing
from veronica.agent.providers.base import ProviderError
from veronica.agent.runctx import Cancelled, LeaseLost
from veronica.engine import budget, failures, fleet, gather, outage, slot, wakes
from veronica.engine.slot import has_unread  # noqa: F401  (drive and the tests read it here)
from veronica.plumbing.errors import storable
from veronica.models import Member, Membership, Phase, RunOutcome, RunStatus, Turn, TurnRole, Wake

log = logging.getLogger(__name__)

__all__ = ["Cancelled", "LeaseLost", "has_unread", "wake"]


def describe(exc: ProviderError) -> str:
    parts = [str(exc)]
    if exc.status:
        parts.append(f"HTTP {exc.status}")
    if exc.request_id:
        parts.append(f"request {exc.request_id}")
    return "; ".join(parts)


# Wakes rung by mail. One whose mail a run already drained (it came while that run was in flight)
# finds nothing: it claims nothing and writes no Run, unless a stopped run left its turn unanswered.
MAIL_SOURCES = ("message", "alarm", "task")


@audit.as_engine
def wake(member_id: int, source: str) -> str:
    """The django-q2 task. Returns a short outcome string (kept in q2's result for debugging).

    Nothing is read before the claim: its UPDATE carries every gate (active, idle, not parked or
    backing off, breaker not tripped, work to do), so the run starts one statement after the wake.
    In a worker with a run pool (veronica.engine.fleet) the task only takes a free slot of the pool
    and hands the wake to it: the claim and the run happen on the pool's thread ("pooled"), so the
    worker's own thread, the one that takes q2's tasks, makes no database round trip per wake and
    takes the next wake at once. (When the claim ran on it, 500 wakes at once queued behind one
    claim at a time per worker, each claim's round trips waiting for the GIL among the pool's runs:
    the last of 500 members started a minute after its mail on a busy host.) Elsewhere the task runs
    the member itself, to the outcome."""
    pool = fleet.current()
    if pool is None:
        lease = claim_for(member_id, source)
        return lease if isinstance(lease, str) else run_claimed(lease, source)
    return "handed-back" if into_pool(pool, [(member_id, source)]) else "pooled"


@audit.as_engine
def wake_all(wakes_: list[tuple[int, str]]) -> str:
    """The django-q2 task of several wakes the host's pusher fetched together (veronica.engine.qbroker),
    each taken as wake() takes it."""
    pool = fleet.current()
    if pool is None:  # (bundled by a pusher whose settings differ from this worker's): each runs here in turn
        return " ".join(wake(member_id, source) for member_id, source in wakes_)
    back = into_pool(pool, wakes_)
    return f"pooled {len(wakes_) - back}, handed back {back}" if back else f"pooled {len(wakes_)}"


def into_pool(pool: fleet.RunPool, wakes_: list[tuple[int, str]]) -> int:
    """Each wake into a run slot of the pool, in order; from the first that finds none (or all of them,
    when this host is cut off from the database: a host that can takes them), the rest go back to the
    broker's head at once, in order. Returns how many went back."""
    for at, (member_id, source) in enumerate(wakes_):
        why = "this host cannot reach the database" if outage.is_down() else no_slot(pool)
        if why:
            hand_back_all(wakes_[at:], why)
            return len(wakes_) - at
        pool.start(lambda member_id=member_id, source=source: claim_and_run(pool, member_id, source), name=f"wake-{member_id}")
    return 0


def no_slot(pool: fleet.RunPool) -> str:
    """'' once a run slot of the pool is reserved; else why there is none for the wake (it goes back)."""
    if pool.try_reserve():
        return ""
    if pool.room_elsewhere():
        # Another worker of this host has a free slot: the wake goes back to the broker now, for it.
        # Waiting here first for a slot of this worker's to free cost the wake over a second in a
        # burst split 257/243 over two workers of 256 slots (bench/fleet.py), and the fleet's completion was its.
        return "every run slot of this worker is taken; another worker of this host has room"
    if pool.reserve():
        return ""
    return "every run slot of this worker stayed busy"  # another host, or later


def resume_here(pool: fleet.RunPool, member_ids: list[int]) -> int:
    """A worker that has just reaped its dead predecessor's leases (veronica.engine.warm) resumes their
    members in its own run pool, as many as it has free slots; the rest are rung through the broker.
    Through the broker, a resume went Redis -> the pusher -> q2's task queue -> this worker's main
    thread, one task at a time among the pool's starting runs (the GIL's): 250 resumes took seconds
    to reach their claims (bench/fleet.py, a worker SIGKILLed mid-way). On PostgreSQL they are claimed
    here, all at once (claim_up_front), before any of them runs: claimed by their threads, through the
    gathering, the later claims waited for the GIL behind the first resumes' steps (those take over
    calls the model gateway kept, already answered, and run at CPU speed), and the last resumes of 244
    started 2.9 s after the reap, rung again by the engine tick. The claim is a wake's own (one
    conditional UPDATE: no second run of a member), and each member still owes its resume
    (failures.owe_resume): one this worker dies before claiming is rung again by the engine tick.
    Returns how many started here."""
    here = []
    for member_id in member_ids:
        if pool.try_reserve():
            here.append(member_id)
        else:
            wakes.enqueue_wake(member_id, "resume")
    leases = claim_up_front(here)
    started = 0
    for member_id in here:
        lease = leases.get(member_id)
        body = ((lambda lease=lease: run_leased(pool, lease, "resume")) if lease is not None else
                (lambda member_id=member_id: claim_and_run(pool, member_id, "resume")))  # its own claim says why not
        try:
            pool.start(body, name=f"wake-{member_id}")
            started += 1
        except Exception:  # (a lease claimed for it runs out: the watchdog releases it and it is owed still)
            log.warning("could not start the resume of member %s here; rung through the broker", member_id, exc_info=True)
            wakes.enqueue_wake(member_id, "resume")
    return started


def claim_up_front(member_ids: list[int]) -> dict:
    """The resumes' claims in a few statements (slot.claim_many, PostgreSQL), before their runs start:
    the leases by member id ({} elsewhere, or when a statement failed: each then claims on its own)."""
    if not member_ids or connections[Member.objects.db].vendor != "postgresql":
        return {}
    leases: dict = {}
    try:
        for at in range(0, len(member_ids), slot.CLAIM_MANY_MOST):
            leases.update(slot.claim_many(member_ids[at:at + slot.CLAIM_MANY_MOST], "resume", ("breaker",)))
    except (OperationalError, InterfaceError):
        log.warning("could not claim the resumes at once; each claims on its own", exc_info=True)
        connections[Member.objects.db].close()
    read_ahead(list(leases.values()))
    return leases


def read_ahead(leases: list[slot.RunLease]) -> None:
    """The resumes' starts, for all of them at once before any runs: their first phase (thinking, one
    UPDATE under their leases), their transcripts and waggle's view of their sessions
    (veronica.agent.read_ahead). Each was a round trip or a commit of its own run, on one of the
    worker's eight pooled connections, held while 250 resumes took turns at the GIL: the resumes
    queued for connections, and the last of 250 made its first call ~2 s after the kept answers were
    there (bench/fleet.py, a worker SIGKILLed). A read that fails leaves each run to read its own."""
    if not leases:
        return
    from veronica.agent import read_ahead as ahead_of

    try:
        slot.phase_many(leases, Phase.THINKING)
        found = ahead_of.read([(lease.member, lease.session) for lease in leases])
    except (OperationalError, InterfaceError):
        log.warning("could not read the resumes' starts ahead; each run reads its own", exc_info=True)
        connections[Member.objects.db].close()
        return
    for lease in leases:
        if lease.session is not None:
            lease.ahead = found.get(lease.session.pk)


def claim_and_run(pool: fleet.RunPool, member_id: int, source: str) -> str:
    """A wake on a run pool's thread: the claim, then the run under the pool's heartbeat. A wake lost
    with a killed worker before its claim is a lost doorbell, as one lost with its broker: the flag
    goes stale and the sweep rings again (veronica.engine.wakes); after the claim, the lease recovers it."""
    lease = claim_for(member_id, source)
    if isinstance(lease, str):
        return lease
    return run_leased(pool, lease, source)


def run_leased(pool: fleet.RunPool, lease: slot.RunLease, source: str) -> str:
    """A claimed run on a run pool's thread, under the pool's heartbeat."""
    pool.register(lease)
    try:
        return run_claimed(lease, source)
    finally:
        pool.unregister(lease)


def claim_for(member_id: int, source: str) -> slot.RunLease | str:
    """The wake's claim: the lease, or why there is no run (the outcome string)."""
    mail = source in MAIL_SOURCES
    gates = ("breaker", "mail") if mail else ("breaker",)
    if outage.is_down():  # this host cannot reach the database: a host that can takes the wake
        return hand_back(member_id, source)
    try:
        lease = first_claim(member_id, source, gates)
    except (OperationalError, InterfaceError) as exc:
        return cut_off(member_id, source, exc)
    if lease is None:
        why, flagged = why_not_claimed(member_id, mail)
        if flagged and wakes.drop_flag(member_id):
            # This wake held the member's wake-queued flag, so mail committed since its claim looked
            # rang nothing (veronica.engine.wakes): look once more, now that a ring enqueues again.
            lease = slot.claim(member_id, source, gates=gates, record_wake=True, open_session=True)
            if lease is None:
                why, _ = why_not_claimed(member_id, mail)
    if lease is None:
        if why == NOTHING_TO_DO and transcript_open(member_id):
            lease = slot.claim(member_id, source, gates=("breaker",), record_wake=True, open_session=True)
        if lease is None:
            if why != "gone":
                Wake.objects.create(member_id=member_id, source=source)
            return why
    return lease  # its claimed Wake row (the metrics split wakes by claimed / coalesced) came in the claim's commit


def run_claimed(lease: slot.RunLease, source: str) -> str:
    """The claimed run, to its finish under the lease (on the task's thread, or a run pool's)."""
    member = lease.member
    traced = tracing.start_run(lease.member, lease.run, source)  # the run's root span (a no-op when tracing is off)
    from veronica.agent.loop import run_member

    outcome, error, permanent, retry_after = RunOutcome.DONE, "", False, None
    try:
        outcome = run_member(lease.member, lease)
    except LeaseLost:
        log.warning("run of %s lost its lease; it stops and writes nothing", member.name)
        tracing.end_run(traced, "lease-lost")
        return "lease-lost"
    except Cancelled:
        outcome = RunOutcome.ABORTED
    except ProviderError as exc:
        log.warning("run of %s failed: %s (permanent=%s)", member.name, exc, exc.permanent)
        outcome, error, permanent, retry_after = RunOutcome.ERROR, describe(exc), exc.permanent, exc.retry_after
    except Exception as exc:  # one member's crash never touches another's run; retried with backoff
        log.exception("run of %s crashed", member.name)
        outcome, error = RunOutcome.ERROR, f"{type(exc).__name__}: {exc}"
    error = storable(error)  # a vendor's error text with a NUL or a lone surrogate in it is still recorded
    try:
        finish_on_a_live_connection(lease, outcome, error, permanent=permanent, retry_after=retry_after)
    except LeaseLost:
        log.warning("run of %s lost its lease before it finished; the watchdog ended it", member.name)
        outcome = "lease-lost"
    tracing.end_run(traced, outcome, error)
    return outcome


NOTHING_TO_DO = "nothing-to-do"
FINISH_ATTEMPTS = 3


def finish_on_a_live_connection(lease: slot.RunLease, outcome: str, error: str, **how) -> None:
    """slot.finish, on a fresh connection when the one it got was dead. After a database outage the
    connections a worker's pool kept were closed by the server, each found dead only when used: a run
    that met one crashed, then its finish met the same one and failed too, and the member stayed
    leased, its mail unread, for the whole run lease (60 s by default). Each retry closes the dead
    connection (the pool discards it) and fences again; a finish whose commit did go through before
    its connection died finds its lease gone on the retry (LeaseLost), so nothing is written twice."""
    conn = connections[Member.objects.db]
    for attempt in range(1, FINISH_ATTEMPTS + 1):
        try:
            slot.finish(lease, outcome, error, **how)
            return
        except (OperationalError, InterfaceError) as exc:
            if attempt == FINISH_ATTEMPTS or conn.in_atomic_block:
                raise
            log.warning("finish of %s met a dead connection (%s); again on a new one", lease.member.name, str(exc).strip()[:200])
            try:
                conn.close()
            except Exception:
                pass


# A worker that cannot reach the database hands its wakes back to the broker (at its head, for a
# host that can) instead of failing each one on a connect timeout. Its failed claim marks the whole
# host cut off (veronica.engine.outage): the pusher stops fetching and the other workers hand back
# what it had fetched already without trying the database, until the engine ticker gets through
# again. BOUNCE_PAUSE after each hand-back keeps a host that still fetches from spinning.
BOUNCE_PAUSE = 0.2


def cut_off(member_id: int, source: str, exc: Exception) -> str:
    outage.mark_down()
    log.warning("wake of member %s: the database is unreachable (%s: %s); handing the wake back", member_id,
                type(exc).__name__, str(exc).strip()[:200])
    try:
        connections[Member.objects.db].close()
    except Exception:
        pass
    return hand_back(member_id, source)


def hand_back(member_id: int, source: str, why: str = "this host cannot reach the database") -> str:
    hand_back_all([(member_id, source)], why)
    return "handed-back"


def hand_back_all(wakes_: list[tuple[int, str]], why: str) -> None:
    """The wakes back to the head of the broker's list, in their order."""
    for member_id, source in reversed(wakes_):
        wakes.enqueue_wake(member_id, source, front=True, owe=False)
    log.info("wake(s) of member(s) %s handed back: %s", ", ".join(f"{m} ({s})" for m, s in wakes_), why)
    time.sleep(BOUNCE_PAUSE)


def first_claim(member_id: int, source: str, gates: tuple[str, ...]) -> slot.RunLease | None:
    """The wake's first statement is its claim, and it doubles as the connection's health check:
    django-q2 re-arms Django's check (a `SELECT 1` round trip) before every task, on the path from a
    commit to its run. A connection found dead by the claim is replaced and the claim made again
    (a token lost with the dead connection is released by the lease watchdog). In a worker's run pool
    on PostgreSQL the claims of a burst are gathered (claim_gathered)."""
    pool = fleet.current()
    if pool is not None and connections[Member.objects.db].vendor == "postgresql":
        lease = pool.claims.ask(claim_gathered, (source, gates), member_id)
        if lease is not gather.OWN_WAY:
            return lease
    return claim_alone(member_id, source, gates)


def claim_alone(member_id: int, source: str, gates: tuple[str, ...]) -> slot.RunLease | None:
    conn = connections[Member.objects.db]
    skipped = conn.connection is not None and conn.health_check_enabled and not conn.health_check_done
    # A pooled connection (veronica.engine.fleet) is not checked on the way out of the pool either.
    skipped = skipped or conn.connection is not None and fleet.pooled_connections()
    if skipped:
        conn.health_check_done = True
    try:
        return slot.claim(member_id, source, gates=gates, record_wake=True, open_session=True)
    except (OperationalError, InterfaceError):
        if not skipped:
            raise
        log.info("the wake's connection was dead; claiming again on a new one")
        conn.close()
        return slot.claim(member_id, source, gates=gates, record_wake=True, open_session=True)


def claim_gathered(args: tuple, member_ids: list[int]) -> list:
    """The first claims a worker's run pool gathered while one was being made (veronica.engine.gather):
    a lone one is a claim as ever (made by the thread that gathers, so the claims arriving meanwhile
    gather for the next call); several go in one statement (slot.claim_many). A member asked for twice
    is claimed once (its other wake finds it claimed, as it would have). When the statement fails, its
    connection is dropped and each wake makes its own claim, on a new one."""
    source, gates = args
    if len(member_ids) == 1:
        return [claim_alone(member_ids[0], source, gates)]
    try:
        leases = slot.claim_many(member_ids, source, gates)
    except (OperationalError, InterfaceError):
        connections[Member.objects.db].close()
        raise
    return [leases.pop(member_id, None) for member_id in member_ids]


def why_not_claimed(member_id: int, mail: bool) -> tuple[str, bool]:
    """Why a claim matched no row, in one query (the outcome string; the state may have moved on),
    and whether the member's wake-queued flag is up with no run holding the slot."""
    row = (Member.objects.filter(pk=member_id)
           .annotate(tripped=budget.tripped_today(), unread=slot.unread_mail(), parked=Exists(Member.objects.filter(
               failures.PARKED, pk=OuterRef("pk"))), backoff=Exists(Member.objects.filter(failures.IN_BACKOFF, pk=OuterRef("pk"))))
           .values("membership", "removed_at", "run_status", "lease_token", "tripped", "unread", "parked", "backoff",
                   "wake_queued_at").first())
    if row is None:
        return "gone", False
    return _why(row, mail), row["wake_queued_at"] is not None and not row["lease_token"]


def _why(row: dict, mail: bool) -> str:
    if row["membership"] != Membership.ACTIVE or row["removed_at"] is not None or row["run_status"] == RunStatus.SUSPENDED:
        return "not-active"
    if row["tripped"]:
        return "budget-tripped"
    if row["parked"]:
        return "parked"
    if row["backoff"]:
        return "backoff"
    if mail and not row["unread"] and row["run_status"] == RunStatus.IDLE and not row["lease_token"]:
        return NOTHING_TO_DO
    return "coalesced"


def transcript_open(member_id: int) -> bool:
    """The member's open session ends in something other than a final reply (a brief, a tool
    result, a call still to answer): a run has work even without unread mail."""
    last = (Turn.objects.filter(session__member_id=member_id, session__ended_at__isnull=True)
            .order_by("-seq").values("role", "tool_calls").first())
    return last is not None and (last["role"] != TurnRole.ASSISTANT or bool(last["tool_calls"]))


