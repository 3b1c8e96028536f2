"""The run slot and its lease: claim, the fenced writes of the holder, finish and release.

A member has one slot. Whoever holds it (a wake's run, an operator's compaction) holds a lease
token with an expiry on the database's clock. Every write the holder makes is fenced: it runs in a
transaction that first renews the lease with

    UPDATE member SET lease_expires_at = NOW() + lease
     WHERE id = ? AND lease_token = ? AND lease_expires_at > NOW()

and rolls back when that matches no row. A holder paused past its lease (SIGSTOP, a swap storm)
therefore writes nothing when it wakes up: the watchdog has ended its Run row and a new run may
own the slot. Expiry is only ever compared on the database's clock, never a host's.

That fence statement is the step's only read of the member row: it also writes the phase the run
asked for (`next_phase`) and reads back the cancel flag and the permission mode, so a step pays one
statement for its lease, its phase, its suspend check and its permission gate. On PostgreSQL the model
turn's fence also carries the call's usage meter (a second UPDATE in the same statement, applied only
if the lease holds). The fence's events are batched (veronica.swarm.events.transaction_batch) and written
just before its commit, which rides the same round trip on PostgreSQL.

On PostgreSQL a run's two ends are one statement each: a wake's claim also writes the Run row, reads
the claimed member back from its RETURNING, finds or opens the member's session, reads its unread mail
and probes what the run's start would read in vain (_claim_in_one); a finish's fence is the release itself, with the Run
row's end (_release_statement), which for a done run also flags the leftover wake its mailbox asks
for. Either writes nothing unless its condition (the claim's gates, the fence's unexpired token) held.
"""
from __future__ import annotations

import logging
import contextvars
import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from typing import Callable, TypeVar

from django.conf import settings
from django.db import connections, transaction
from django.db.models import Case, Exists, F, OuterRef, Q, Value, When
from django.db.models.functions import Now
from django.db.models.sql import UpdateQuery

from veronica.swarm import events
from veronica.plumbing.compiled_select import fetch, instances
from veronica.plumbing.begin_rides import riding
from veronica.plumbing.returning import compiled, update_returning, update_returning_compiled, update_then
from veronica.agent import runstart
from veronica.agent.providers import sdk
from veronica.agent.runctx import STOP, Cancelled, LeaseLost
from veronica.engine import budget, failures, holders
from veronica.engine import wakes
from veronica.models import Member, Membership, Message, Phase, Run, RunOutcome, RunStatus, Session, Wake

log = logging.getLogger(__name__)
T = TypeVar("T")

# Mail that arrived during these runs was coalesced into them: wake again to drain it. A run that
# ended waiting for an operator, paused at its iteration limit, errored or hit its budget must not
# loop on its own mail (the decision, new mail, the backoff or the tick's sweep wakes it).
REWAKE_AFTER = {RunOutcome.DONE, RunOutcome.ABORTED}


def lease_delta() -> timedelta:
    return timedelta(seconds=settings.RUN_LEASE_SECONDS)


def renew(member_id: int, token: str, *, honour_cancel: bool) -> None:
    """Renew-and-check on the DB clock. Raises LeaseLost, or Cancelled when a stop was asked for (a
    stopped run's lease is then left as it was). One statement, compiled once per shape: a run renews
    this way whenever the process's heartbeat has not lately (a run's start, a check between steps)."""
    seconds = settings.RUN_LEASE_SECONDS

    def build(slot):
        renewed = Now() + timedelta(seconds=seconds)
        if honour_cancel:
            renewed = Case(When(cancel_requested=True, then=F("lease_expires_at")), default=renewed)
        return (Member.objects.filter(pk=slot.int("id"), lease_token=slot.str("token"), lease_expires_at__gt=Now()),
                {"lease_expires_at": renewed})
    row = update_returning(("renew", seconds, honour_cancel), build, ["cancel_requested"], {"id": member_id, "token": token})
    if row is None:
        raise LeaseLost(f"the lease {token[:8]} of member {member_id} is gone")
    if honour_cancel and row[0]:
        raise Cancelled("the run was asked to stop")


def write_phase(member: Member, phase: str, tool: str = "") -> None:
    """Phases are derived from the member's own events: the row follows the event we emit."""
    if member.phase == phase and member.phase_tool == tool:
        return
    with transaction.atomic(savepoint=False):
        Member.objects.filter(pk=member.pk).update(phase=phase, phase_tool=tool, phase_since=Now())
        events.emit(member.space_id, "member.phase", member=member, phase=phase, tool=tool)
    member.phase, member.phase_tool = phase, tool


class _NotAll(Exception):
    """phase_many: a lease no longer held (its transaction rolls back)."""


def phase_many(leases: list["RunLease"], phase: str, tool: str = "") -> int:
    """One phase for several runs just claimed (a worker's resumes, veronica.engine.runner.read_ahead),
    in one UPDATE under their leases and one event statement: what each run's own fence would write
    (phase_since re-stamped as every fence does). All or none: when a lease no longer holds, nothing is
    written and each run writes its own. Returns how many members it set."""
    todo = [lease for lease in leases if (lease.member.phase, lease.member.phase_tool) != (phase, tool)]
    if not todo:
        return 0
    try:
        with events.transaction_batch():
            held = Member.objects.filter(pk__in=[lease.member.pk for lease in todo], lease_token__in=[lease.token for lease in todo],
                                         lease_expires_at__gt=Now()).update(phase=phase, phase_tool=tool, phase_since=Now())
            if held != len(todo):  # (ids and tokens are unique: every lease matched, or one is gone)
                raise _NotAll
            for lease in todo:
                events.emit(lease.member.space_id, "member.phase", member=lease.member, phase=phase, tool=tool)
    except _NotAll:
        return 0
    for lease in todo:
        lease.member.phase, lease.member.phase_tool = phase, tool
    return len(todo)


# A cancel flag read by a fence this recently answers check() without a statement of its own.
FRESH_CHECK_SECONDS = 0.25
# While a tool call runs, the cancel flag is read this often: a suspend ends a command within it.
CANCEL_POLL_SECONDS = 0.5


def _fence_statement(member_id: int, token: str, phase: tuple[str, str] | None, meter=None):
    """Renew-and-check (and the phase, when given) in one UPDATE; (cancel_requested, permission_mode,
    metered) or None when the lease is gone. Every fence is a step's write (a model turn, a tool's start
    or result, a phase), so it also re-stamps phase_since: the stall watchdog's clock of progress,
    which heartbeats alone (renew) never move. meter: a model call's usage statement (budget.meter_statement)
    that PostgreSQL runs in the same statement, only if the lease holds; metered is then its row (None:
    no usage row yet today, or no meter given)."""
    seconds = settings.RUN_LEASE_SECONDS

    def build(slot):
        qs = Member.objects.filter(pk=slot.int("id"), lease_token=slot.str("token"), lease_expires_at__gt=Now())
        values = {"lease_expires_at": Now() + timedelta(seconds=seconds), "phase_since": Now()}
        if phase is not None:
            values.update(phase=slot.str("phase"), phase_tool=slot.str("tool"))
        return qs, values
    values = {"id": member_id, "token": token}
    if phase is not None:
        values.update(phase=phase[0], tool=phase[1])
    key, columns = ("fence", seconds, phase is not None), ["cancel_requested", "permission_mode"]
    if meter is not None:
        both = update_then(compiled(key, build, columns), values, *meter)
        if both is None:
            return None
        row, usage = both
        return bool(row[0]), row[1], usage
    row = update_returning(key, build, columns, values)
    return None if row is None else (bool(row[0]), row[1], None)


class RunLease:
    """The engine's side of veronica.agent.runctx.RunContext, for one claimed slot."""

    def __init__(self, member: Member, token: str, run: Run, source: str, *, session=None, unread=None) -> None:
        self.member, self.token, self.run, self.source = member, token, run, source
        self._last_check = time.monotonic()  # the last renewal that also read the cancel flag
        self._stop: Cancelled | None = None
        self._depth = 0
        self._next_phase: tuple[str, str] | None = None
        self._meter = None  # a model call's usage statement the next fence carries (PostgreSQL)
        self._metered = None  # its row, for metering.record
        self.system_prompt = ""  # the run's system prompt (agent.loop sets it), kept on the Run row by finish()
        self.permission_mode = member.permission_mode  # as of the latest fence
        self.thread: int | None = None  # the run's thread, while a run pool's heartbeat renews the lease
        self.beat = None  # the worker's run pool (veronica.engine.fleet) when its heartbeat renews this lease
        self._last_beat = 0.0
        self.touched = time.monotonic()  # the run's thread last showed it is alive (the heartbeat renews only then)
        self.model_calls = self.tokens = 0  # the Run row's counters, written by finish()
        self.session = session  # the member's open session when the claim read or opened it (agent.loop reads it)
        self.unread = unread  # the member's unread mail when the claim read it (agent.loop's start reads it once)
        self.ahead = None  # what the run's start would read, read with other runs' (veronica.agent.read_ahead)
        self.rewake = False  # the finish's release flagged the member for a leftover wake (finish enqueues it)

    def count_call(self, tokens: int) -> None:
        self.model_calls += 1
        self.tokens += tokens

    def _fence(self) -> None:
        """The first statement of every fenced transaction (see the module's docstring)."""
        self.touched = time.monotonic()
        meter, self._meter, self._metered = self._meter, None, None
        if isinstance(self._stop, LeaseLost):
            raise self._stop
        want, self._next_phase = self._next_phase, None
        member = self.member
        if want is not None and (member.phase, member.phase_tool) == want:
            want = None
        row = _fence_statement(member.pk, self.token, want, meter)
        if row is None:
            self._stop = LeaseLost(f"the lease {self.token[:8]} of member {member.pk} is gone")
            raise self._stop
        cancel, self.permission_mode, self._metered = row
        self._last_check = time.monotonic()
        if cancel and self._stop is None:
            self._stop = Cancelled("the run was asked to stop")
        if want is not None:
            member.phase, member.phase_tool = want
            events.emit(member.space_id, "member.phase", member=member, phase=want[0], tool=want[1])

    def next_phase(self, phase: str, tool: str = "") -> None:
        """The phase the next fence writes (in its own statement, at no cost of its own)."""
        self._next_phase = (phase, tool)

    def meter_in_fence(self, statement) -> bool:
        """PostgreSQL: the next fence also runs this usage statement (budget.meter_statement), in its own
        statement and only if the lease holds; take_metered() then returns its row. False: not carried.
        statement may be a callable that makes it: then it is made only when it will be carried (a
        record() inside billed()'s open fence need not build one)."""
        if self._depth or connections[Member.objects.db].vendor != "postgresql":
            return False
        self._meter = statement() if callable(statement) else statement
        return True

    def take_metered(self):
        """The usage row the latest fence metered (None: none carried, or no usage row yet today)."""
        row, self._metered = self._metered, None
        return row

    def _renew(self, *, honour_cancel: bool) -> None:
        if isinstance(self._stop, LeaseLost):
            raise self._stop
        try:
            renew(self.member.pk, self.token, honour_cancel=honour_cancel)
        except LeaseLost as lost:
            self._stop = lost
            raise
        if honour_cancel:  # fenced writes renew too, but only this reads a suspend
            self._last_check = time.monotonic()

    def check(self) -> None:
        if self._stop is not None:
            raise self._stop
        if time.monotonic() - self._last_check < FRESH_CHECK_SECONDS:
            return  # the step's fence has just read the cancel flag
        self._renew(honour_cancel=True)

    def heard(self, held: bool, cancel: bool) -> None:
        """The process's heartbeat (veronica.engine.fleet) renewed the leases it holds and read back this one:
        still held or not, and whether a stop was asked for. The run's next check or should_stop acts on it."""
        if not held:
            if not isinstance(self._stop, LeaseLost):
                self._stop = LeaseLost(f"the lease {self.token[:8]} of member {self.member.pk} is gone")
                sdk.interrupt(self.thread)  # a model call it waits on ends now, not at its next poll
            return
        self._last_beat = self._last_check = time.monotonic()
        if cancel and self._stop is None:
            self._stop = Cancelled("the run was asked to stop")
            sdk.interrupt(self.thread)

    def beating(self) -> bool:
        """The process's heartbeat has renewed this lease lately (else the run renews it itself)."""
        return self.beat is not None and time.monotonic() - self._last_beat < 3 * settings.RUN_HEARTBEAT_SECONDS

    def idle(self) -> None:
        """About to wait (a model call): a run of a run pool holds no database connection while it waits."""
        if self.beat is not None and not self._depth:
            self.beat.idle()

    def should_stop(self) -> bool:
        self.touched = time.monotonic()
        if self._stop is not None:
            return True
        if self.beating():
            return False
        if time.monotonic() - self._last_check < settings.RUN_HEARTBEAT_SECONDS:
            return False
        try:
            self._renew(honour_cancel=True)
        except Cancelled as exc:
            self._stop = exc
            return True
        return False

    def stop_reason(self) -> Cancelled:
        return self._stop or Cancelled("model call aborted")

    def can_release_in_fence(self) -> bool:
        """PostgreSQL, no fence open, no meter or phase waiting for the next fence: finish() may release
        the slot and end the Run row in the fence statement itself (fenced(release=...))."""
        want, member = self._next_phase, self.member
        return (not self._depth and self._meter is None and (want is None or want == (member.phase, member.phase_tool))
                and connections[Member.objects.db].vendor == "postgresql")

    def _release_fence(self, end, look: bool) -> None:
        """The finish's fence (see finish): the lease checked, the slot released and the Run row ended in
        one statement, or nothing (LeaseLost). look: the same statement flags the member for a leftover
        wake when unread mail waits (self.rewake says whether it did)."""
        self.touched = time.monotonic()
        if isinstance(self._stop, LeaseLost):
            raise self._stop
        self._next_phase = None
        both = _release_statement(self.member.pk, self.token, end, look)
        if both is None:
            self._stop = LeaseLost(f"the lease {self.token[:8]} of member {self.member.pk} is gone")
            raise self._stop
        self.rewake = look and both[0][0] is not None

    @contextmanager
    def fenced(self, release=None, look: bool = False):
        """release: the finish's own fence (can_release_in_fence; end_statement's Run row UPDATE); look:
        it also flags a leftover wake (_release_statement)."""
        if self._depth:  # already inside this run's fence: one renew per transaction is enough
            yield
            return
        try:
            with events.transaction_batch():
                if release is not None:
                    self._release_fence(release, look)
                else:
                    self._fence()
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
        finally:
            if self.beat is not None:  # a run of a run pool holds a connection only while it writes
                self.beat.after_write()

    def keep_alive(self, fn: Callable[[], T]) -> T:
        """Run fn in a helper thread (it must not touch the DB) and renew the lease while it runs.
        The cancel flag is read every CANCEL_POLL_SECONDS meanwhile: a stop sets the step's STOP event
        and the tool ends its command or MCP call at once; its result (saying so) is still written.
        A lost lease abandons the step: its result is never written."""
        box: dict = {}
        done = threading.Event()
        stop = threading.Event()
        context = contextvars.copy_context()  # the step keeps the run's context (its trace span, for one)
        context.run(STOP.set, stop)

        def target() -> None:
            try:
                box["value"] = context.run(fn)
            except BaseException as exc:  # handed to the run's thread
                box["error"] = exc
            finally:
                connections.close_all()  # this thread's own connections, if fn opened any
                done.set()

        threading.Thread(target=target, name=f"step-{self.member.pk}", daemon=True).start()
        renewed = time.monotonic()
        wait = min(CANCEL_POLL_SECONDS, settings.RUN_HEARTBEAT_SECONDS)
        self.idle()
        try:
            while not done.wait(wait):
                self.touched = time.monotonic()
                if self.beating():  # the process's heartbeat renews the lease and reads the flag
                    if isinstance(self._stop, LeaseLost):
                        raise self._stop
                    if self._stop is not None:
                        stop.set()
                    continue
                if not stop.is_set() and self._stop_asked():
                    stop.set()
                if time.monotonic() - renewed >= settings.RUN_HEARTBEAT_SECONDS:
                    self._renew(honour_cancel=False)  # the step's result is written even after a cancel
                    renewed = time.monotonic()
        except BaseException:
            stop.set()  # a lost lease: the command must not outlive the run
            raise
        if "error" in box:
            raise box["error"]
        return box["value"]

    def _stop_asked(self) -> bool:
        """A suspend or remove set the flag, or the slot is no longer ours (one cheap read)."""
        flag = Member.objects.filter(pk=self.member.pk, lease_token=self.token).values_list("cancel_requested", flat=True).first()
        return flag is None or bool(flag)

    def phase(self, phase: str, tool: str = "", *, step: bool = False) -> None:
        """step: a new model or tool call begins. Every fence statement re-stamps phase_since (the
        stall clock the watchdog reads), so a call in an unchanged phase is progress at the cost of
        one fence when no fence is open; a plain report in an unchanged phase writes nothing."""
        if self.member.phase == phase and self.member.phase_tool == tool:
            self._next_phase = None
            if step and not self._depth:
                with self.fenced():
                    pass
            return
        if self._depth:
            write_phase(self.member, phase, tool)
            return
        self._next_phase = (phase, tool)
        with self.fenced():  # the fence statement writes it
            pass


def claim(member: Member | int, source: str, *, held_ok: bool = False, gates: tuple[str, ...] = (),
          record_wake: bool = False, open_session: bool = False) -> RunLease | None:
    """One conditional UPDATE takes the slot; the Run row is written in the same commit, so a run
    never exists without its lease nor a lease without its Run row. A parked member is not claimed,
    nor one in backoff unless the wake is the retry itself (source `resume`: the backoff's own ring,
    an operator's resume, a decision). held_ok: compaction may claim both, it is how a context
    overflow gets fixed. gates: more conditions checked in the same UPDATE, "breaker" (not tripped
    today) and "mail" (unread mail waiting). Given an id, the member is read inside the claim's
    transaction (the wake's path: nothing is read before the claim); given a Member, that object is
    refreshed. record_wake: the wake's claimed Wake row (the metrics') is written in the claim's commit
    (on PostgreSQL inside its event statement), not in a statement of its own after it.

    On PostgreSQL, a claim by id is ONE statement (_claim_in_one): the conditional UPDATE, the Run row's
    INSERT and the read of the claimed member and its space; with open_session (a wake's run), also the
    member's open session, opened in the claim's commit when there is none (lease.session, None elsewhere),
    and its unread mail (lease.unread; None when not read: another backend, or more than CLAIM_MAIL).
    Mail committed after the claim's statement is the finish's to pass on, as mail after the run's own
    read always was: the claim holds the wake-queued flag, and the release looks at the mailbox."""
    by_id = isinstance(member, int)
    member_id = member if by_id else member.pk
    token = holders.new_token()  # names its holder: a death on this machine is known at once
    session = unread = None
    with events.transaction_batch():
        if by_id and connections[Member.objects.db].vendor == "postgresql":
            taken = _claim_in_one(member_id, token, source, held_ok, gates, open_session)
            if taken is None:
                return None
            member, run, session, unread = taken
        else:
            if not _claim_update(member_id, token, source, held_ok, gates):
                return None
            # The Run row first: its started_at is the claim's, not one member read later.
            run = Run.objects.create(member_id=member_id, source=source, lease_token=token, started_at=Now())
            if by_id:
                member = _claimed_member(member_id)
        woke = _started(member, run, source)
        if record_wake:
            _write_wakes([woke])
    if not by_id:
        member.refresh_from_db()
    return RunLease(member, token, run, source, session=session, unread=unread)


def _started(member: Member, run: Run, source: str) -> Wake:
    """A claim's run.started event (in the claim's transaction); its claimed Wake row, not yet written."""
    run.member = member
    events.emit(member.space_id, "run.started", member=member, run=run.pk, source=source)
    return Wake(member_id=member.pk, source=source, claimed=True)


def _write_wakes(woke: list[Wake]) -> None:
    """The claims' Wake rows (the metrics'): in the batch's own statement on PostgreSQL, else now."""
    if not events.defer_insert(Wake, woke):
        Wake.objects.bulk_create(woke)


def _claimed_member(member_id: int) -> Member:
    return fetch(("claimed-member",), _claimed_member_query, {"id": member_id})[0]


def _claimed_member_query(s):
    return Member.objects.select_related("space").filter(pk=s.int("id"))


def claimable(source: str, *, held_ok: bool = False, gates: tuple[str, ...] = ()) -> Q:
    """Which member rows a claim may take (besides being idle, active and unleased)."""
    q = Q() if held_ok else ~failures.PARKED if source == "resume" else failures.RUNNABLE
    if "breaker" in gates:
        q &= ~budget.tripped_today()
    if "mail" in gates:
        q &= unread_mail()
    return q


# The claim's UPDATE, compiled by the ORM once per shape and then run with this claim's token and
# member: compiling it (the parked-config expression, two EXISTS) cost more than running it, on
# the path from a wake to its run. Everything else in the key is fixed within the shape.
_TOKEN, _MEMBER = "\x00claim-token\x00", -918273645
_claim_sql: dict[tuple, tuple[str, list, int, int]] = {}


def _claim_update(member_id: int, token: str, source: str, held_ok: bool, gates: tuple[str, ...]) -> int:
    conn = connections[Member.objects.db]
    key = _claim_key(conn, source, held_ok, gates)
    sql, params, token_at, member_at = _claim_compiled(key, held_ok, source, gates)
    params = list(params)
    params[token_at], params[member_at] = token, member_id
    with conn.cursor() as cursor:
        with riding(conn):  # the claim opens its transaction: its BEGIN rides along
            cursor.execute(sql, params)
        return cursor.rowcount


def _claim_key(conn, source: str, held_ok: bool, gates: tuple[str, ...]) -> tuple:
    return (conn.alias, conn.vendor, held_ok, source == "resume", tuple(sorted(gates)), settings.RUN_LEASE_SECONDS,
            budget.today() if "breaker" in gates else None)


def _claim_compiled(key: tuple, held_ok: bool, source: str, gates: tuple[str, ...]) -> tuple[str, list, int, int]:
    """The claim's UPDATE for this shape: (sql, params, the token's index, the member's index)."""
    compiled = _claim_sql.get(key)
    if compiled is None:
        if len(_claim_sql) > 32:  # a new day (or tests changing the lease): old shapes are dead
            _claim_sql.clear()
        query = Member.objects.filter(
            claimable(source, held_ok=held_ok, gates=gates), pk=_MEMBER, run_status=RunStatus.IDLE,
            membership=Membership.ACTIVE, removed_at__isnull=True, lease_token="",
        ).query.chain(UpdateQuery)
        query.add_update_values(dict(run_status=RunStatus.BUSY, lease_token=_TOKEN, lease_expires_at=Now() + lease_delta(),
                                     cancel_requested=False, wake_queued_at=Now()))  # the run owns the flag (wakes.ring)
        sql, params = query.get_compiler(key[0]).as_sql()
        params = list(params)
        token_at = [i for i, p in enumerate(params) if p == _TOKEN]
        member_at = [i for i, p in enumerate(params) if p == _MEMBER]
        if len(token_at) != 1 or len(member_at) != 1:
            raise RuntimeError("the claim's UPDATE did not compile to one token and one member parameter")
        compiled = _claim_sql[key] = (sql, params, token_at[0], member_at[0])
    return compiled


# PostgreSQL: the claim, its Run row, the read of the claimed member (and its space) and, for a wake's
# run, its open session (inserted when there is none), in ONE statement of data-modifying CTEs: a run's
# start was the claim, the Run INSERT, a SELECT of the member, a SELECT of its open session and a
# transaction of its own to open one, five round trips (and their ORM compiles) on the path from a wake
# to its first model call. Each INSERT reads from the claim's RETURNING, so nothing is written unless
# the claim took the slot: the statement is the claim, as atomic as its UPDATE alone. The member's
# columns come from that RETURNING (the claimed row as it now is), never from a read of the table,
# which a CTE's sibling statement would see as it was before the claim.
_one_sql: dict[tuple, tuple[str, list, int, int]] = {}
# A wake's claim also reads its member's unread mail (the claim's row repeated per message), up to this
# many: a longer mailbox is read by the run's start as before (bus.unread_list) rather than repeat the
# member's and space's columns on every row.
CLAIM_MAIL = 8


def _insert_from_claim(model, exprs: dict[str, str], claim_alias: str) -> tuple[str, list]:
    """INSERT INTO model (every concrete column) SELECT ... FROM the claim: the columns named in exprs
    take that SQL, every other one its field's default (bound)."""
    conn = connections[model.objects.db]
    qn = conn.ops.quote_name
    columns, values, params = [], [], []
    for f in model._meta.concrete_fields:
        if f.primary_key:
            continue
        columns.append(qn(f.column))
        cast = f"%s::{f.cast_db_type(conn)}"  # typed: an INSERT ... SELECT does not type a bare parameter by its column
        if f.column in exprs:
            values.append(cast if exprs[f.column] == "%s" else exprs[f.column])
        else:
            values.append(cast)
            params.append(f.get_db_prep_save(f.get_default(), conn))
    returning = ", ".join(qn(f.column) for f in model._meta.concrete_fields if f.primary_key or f.column in exprs)
    return (f"INSERT INTO {qn(model._meta.db_table)} ({', '.join(columns)}) SELECT {', '.join(values)} FROM {claim_alias} "
            f"RETURNING {returning}"), params


def _one_statement(key: tuple, update_sql: str, update_params: list, token_at: int, member_at: int, open_session: bool,
                   many: bool = False):
    """The claim statement for one member (bound per claim: its token, its member, the Run's source and
    token), or with many, for several at once (claim_many): the UPDATE takes the members whose ids
    are in an array, each with its token from a second array, and every CTE joins on the member."""
    compiled = _one_sql.get(key)
    if compiled is not None:
        return compiled
    conn = connections[Member.objects.db]
    qn = conn.ops.quote_name
    if many:
        own_id = f"{qn(Member._meta.db_table)}.{qn('id')}"
        update_sql, update_params = _spliced(update_sql, update_params, {
            member_at: ("ANY(%s::bigint[])", [_IDS]),
            token_at: (f"(%s::varchar[])[array_position(%s::bigint[], {own_id})]", [_TOKENS, _IDS])})
    member_cols = ", ".join(f"{qn(Member._meta.db_table)}.{qn(f.column)}" for f in Member._meta.concrete_fields)
    space = Member._meta.get_field("space").related_model
    space_cols = ", ".join(f"sp.{qn(f.column)}" for f in space._meta.concrete_fields)
    run_sql, run_params = _insert_from_claim(Run, {"member_id": "c.id", "source": "%s",
                                                   "lease_token": "c.lease_token" if many else "%s",
                                                   "started_at": "STATEMENT_TIMESTAMP()"}, "c")
    run_params = ([_SOURCE] if many else [None, None]) + run_params  # the source (and the token), bound per claim
    parts = [f"c AS ({update_sql} RETURNING {member_cols})", f"r AS ({run_sql})"]
    params = list(update_params) + run_params
    pick = "r.id, r.started_at, NULL::bigint, NULL::timestamptz, FALSE"
    joins = ""
    if open_session:
        sess = qn(Session._meta.db_table)
        session_sql, session_params = _insert_from_claim(Session, {"member_id": "c.id", "started_at": "STATEMENT_TIMESTAMP()"},
                                                         f"c WHERE NOT EXISTS (SELECT 1 FROM {sess} o WHERE o.member_id = c.id "
                                                         "AND o.ended_at IS NULL)")
        if many:
            parts.append(f"o AS (SELECT DISTINCT ON (o.member_id) o.id, o.member_id, o.started_at FROM {sess} o JOIN c "
                         "ON o.member_id = c.id WHERE o.ended_at IS NULL ORDER BY o.member_id, o.id)")
        else:
            parts.append(f"o AS (SELECT o.id, o.started_at FROM {sess} o, c WHERE o.member_id = c.id AND o.ended_at IS NULL "
                         "ORDER BY o.id LIMIT 1)")
        parts.append(f"n AS ({session_sql})")
        params += session_params
        pick = ("r.id, r.started_at, COALESCE(o.id, n.id), COALESCE(o.started_at, n.started_at), n.id IS NOT NULL, "
                + ", ".join(sql for _, sql in runstart.probes(qn)))  # what the run's start need not read
        msg = qn(Message._meta.db_table)
        mail_cols = ", ".join(f"m.{qn(f.column)}" for f in Message._meta.concrete_fields)
        # the mailbox the run's start reads (bus.unread_list), a row per message (one row of NULLs: none)
        on = "ON {0}.member_id = c.id" if many else "ON TRUE"
        joins = (f" LEFT JOIN o {on.format('o')} LEFT JOIN n {on.format('n')} LEFT JOIN LATERAL (SELECT {mail_cols} FROM {msg} m WHERE "
                 f"m.recipient_id = c.id AND m.read_at IS NULL ORDER BY m.id LIMIT {CLAIM_MAIL + 1}) um ON TRUE")
        space_cols += ", " + ", ".join(f"um.{qn(f.column)}" for f in Message._meta.concrete_fields)
    run_join = "JOIN r ON r.member_id = c.id" if many else "CROSS JOIN r"
    sql = (f"WITH {', '.join(parts)} SELECT {pick}, c.*, {space_cols} FROM c JOIN {qn(space._meta.db_table)} sp "
           f"ON sp.id = c.space_id {run_join}{joins}")
    if many:
        sql += f" ORDER BY c.{qn('id')}" + (f", um.{qn('id')}" if open_session else "")
    if len(_one_sql) > 32:
        _one_sql.clear()
    compiled = _one_sql[key] = (sql, params, token_at, member_at)
    return compiled


def _claim_in_one(member_id: int, token: str, source: str, held_ok: bool, gates: tuple[str, ...], open_session: bool):
    """PostgreSQL: the claim, its Run row and the claimed member in one statement (see _one_sql above).
    (member, run, session or None, unread mail or None: not read), or None when the claim took nothing (then
    nothing was written)."""
    conn = connections[Member.objects.db]
    key = _claim_key(conn, source, held_ok, gates)
    update_sql, update_params, token_at, member_at = _claim_compiled(key, held_ok, source, gates)
    sql, params, _, _ = _one_statement((*key, open_session), update_sql, update_params, token_at, member_at, open_session)
    params = list(params)
    n = len(update_params)
    params[token_at], params[member_at], params[n], params[n + 1] = token, member_id, source, token
    with conn.cursor() as cursor:
        with riding(conn):  # the claim opens its transaction: its BEGIN rides along
            cursor.execute(sql, params)
        rows = cursor.fetchall()
    if not rows:
        instances(("claimed-member",), _claimed_member_query, [])  # its shape compiled all the same (a warm-up claims no row)
        return None
    return _taken(rows, member_id, source, token, open_session)


def _taken(rows: list, member_id: int, source: str, token: str, open_session: bool):
    """(member, run, session, unread) from one member's rows of a claim statement."""
    conn = connections[Member.objects.db]
    row = rows[0]
    run_id, started_at, session_id, session_started, fresh = row[:5]
    probed = len(runstart.KINDS) if open_session else 0
    mail = len(Message._meta.concrete_fields) if open_session else 0
    member = instances(("claimed-member",), _claimed_member_query, [row[5 + probed:len(row) - mail]])[0]
    run = Run(pk=run_id, member_id=member_id, source=source, lease_token=token, started_at=started_at)
    _loaded(run, conn)
    session = None
    if session_id is not None:
        session = Session(pk=session_id, member_id=member_id, started_at=session_started)
        _loaded(session, conn)
        session.member = member
        session.fresh = bool(fresh)  # opened by this claim: known to have no turn
        session.start_empty = runstart.found_empty(row[5:5 + probed])  # what the run's start need not read
    unread = None
    if mail and len(rows) <= CLAIM_MAIL:
        from veronica.swarm import bus

        unread = bus.unread_from([r[-mail:] for r in rows if r[-mail] is not None])
    return member, run, session, unread


# The arrays a claim of many binds (placeholders, replaced per claim).
_IDS, _TOKENS, _SOURCE = "\x00claim-ids\x00", "\x00claim-tokens\x00", "\x00claim-source\x00"
CLAIM_MANY_MOST = 64  # members in one claim statement (a worker's burst of wakes goes in a few)


def _spliced(sql: str, params: list, at: dict[int, tuple[str, list]]) -> tuple[str, list]:
    """sql with its placeholders number i (for each i of at) replaced by at[i]'s SQL and parameters."""
    pieces = sql.split("%s")
    if "%%" in sql or len(pieces) != len(params) + 1:
        raise RuntimeError("the claim's UPDATE has placeholders this splice cannot count")
    out, bound = [pieces[0]], []
    for i, param in enumerate(params):
        text, extra = at.get(i, ("%s", [param]))
        out += [text, pieces[i + 1]]
        bound += extra
    return "".join(out), bound


def claim_many(member_ids: list[int], source: str, gates: tuple[str, ...] = ()) -> dict[int, RunLease]:
    """PostgreSQL: the wakes' claims of several members (claim(id, source, gates=gates, record_wake=True,
    open_session=True) for each) in ONE statement and one commit: each member is claimed, or not, by
    exactly the conditions of its own claim, row by row, with a token of its own (a run pool gathers the
    claims of a burst of wakes: veronica.engine.gather). The leases of the members claimed, by id.
    Lock order: the member rows, then the spaces' rows (their event counters) in the order of their ids,
    so two claims of many never wait on each other's spaces in a circle. (A deadlock with another
    statement over the member rows fails this one: each wake then makes its own claim.)"""
    ids = sorted(set(member_ids))
    tokens = {member_id: holders.new_token() for member_id in ids}
    leases: dict[int, RunLease] = {}
    if not ids:
        return leases
    conn = connections[Member.objects.db]
    key = _claim_key(conn, source, False, gates)
    update_sql, update_params, token_at, member_at = _claim_compiled(key, False, source, gates)
    sql, params, _, _ = _one_statement((*key, True, "many"), update_sql, update_params, token_at, member_at, True, many=True)
    bind = {_IDS: ids, _TOKENS: [tokens[member_id] for member_id in ids], _SOURCE: source}
    params = [bind.get(p, p) if isinstance(p, str) else p for p in params]
    probed = len(runstart.KINDS)
    with events.transaction_batch():
        with conn.cursor() as cursor:
            with riding(conn):  # the claim opens its transaction: its BEGIN rides along
                cursor.execute(sql, params)
            rows = cursor.fetchall()
        by_member: dict[int, list] = {}
        for row in rows:
            by_member.setdefault(row[5 + probed], []).append(row)  # the member's id: its first column
        taken = sorted((_taken(mine, member_id, source, tokens[member_id], True) for member_id, mine in by_member.items()),
                       key=lambda t: (t[0].space_id, t[0].pk))
        woke = []
        for member, run, session, unread in taken:  # the spaces' event counters are locked in the order of their ids
            woke.append(_started(member, run, source))
            leases[member.pk] = RunLease(member, tokens[member.pk], run, source, session=session, unread=unread)
        if woke:
            _write_wakes(woke)
    return leases


def _loaded(obj, conn) -> None:
    obj._state.adding, obj._state.db = False, conn.alias


def released() -> dict:
    """The member row's slot columns once its run gave the slot back. A suspended member stays suspended.
    The wake-queued flag goes with it: mail committed from here on rings for itself."""
    return {"run_status": Case(When(run_status=RunStatus.BUSY, then=Value(RunStatus.IDLE)), default=F("run_status")),
            "lease_token": "", "lease_expires_at": None, "cancel_requested": False, "wake_queued_at": None}


def release(member: Member, token: str) -> None:
    """Give the slot back (inside the fenced finish)."""
    def build(slot):
        return Member.objects.filter(pk=slot.int("id"), lease_token=slot.str("token")), released()
    update_returning(("release",), build, ["id"], {"id": member.pk, "token": token})  # one statement, compiled once


def _release_statement(member_id: int, token: str, end, look: bool = False):
    """PostgreSQL, the first statement of a finish's transaction: the fence's condition (our token, not
    expired, on the database's clock) on an UPDATE that releases the slot (and re-stamps phase_since,
    as every fence does), and the Run row's end applied only if it matched (update_then). The fence,
    the Run UPDATE and the release were three round trips; the transaction's events still follow it.

    look: the release also looks at the mailbox (what wakes.ring(leftover=True) did in a statement and
    a connection checkout of its own after the commit): the wake-queued flag is set instead of cleared
    when the member will be idle and active with unread mail, and the first row returned is the flag.
    Mail committed before this statement is seen by it; mail committed after it rings for itself, since
    its ring's UPDATE waits on this row's lock and then finds the flag as this commit left it.
    None: the lease is gone and nothing was written."""
    def build(slot):
        qs = Member.objects.filter(pk=slot.int("id"), lease_token=slot.str("token"), lease_expires_at__gt=Now())
        values = {**released(), "phase_since": Now()}
        if look:  # the old row's values: busy becomes idle here, a suspended member stays suspended
            values["wake_queued_at"] = Case(When(Q(run_status__in=(RunStatus.BUSY, RunStatus.IDLE), membership=Membership.ACTIVE,
                                                   removed_at__isnull=True) & unread_mail(), then=Now()), default=None)
        return qs, values
    first = compiled(("fence-release", look), build, ["wake_queued_at" if look else "id"])
    return update_then(first, {"id": member_id, "token": token}, *end)


def has_unread(member_id: int) -> bool:
    return Message.objects.filter(recipient_id=member_id, read_at__isnull=True).exists()


def unread_mail() -> Exists:
    """The claim's work gate for mail wakes: the member row has unread mail."""
    return Exists(Message.objects.filter(recipient=OuterRef("pk"), read_at__isnull=True))


def end_run(lease: RunLease, outcome: str, error: str) -> None:
    """The Run row's end (inside the fenced finish): one UPDATE, compiled once per shape."""
    statement, values = end_statement(lease, outcome, error)
    update_returning_compiled(statement, values)


def end_statement(lease: RunLease, outcome: str, error: str):
    """end_run's UPDATE ... RETURNING, compiled once per shape, and this run's values: (compiled, values)."""
    keep_prompt = bool(lease.system_prompt)

    def build(slot):
        values = {"ended_at": Now(), "outcome": slot.str("outcome"), "error": slot.str("error"),
                  "model_calls": F("model_calls") + slot.int("calls"), "tokens": F("tokens") + slot.int("tokens")}
        if keep_prompt:
            values["system_prompt"] = slot.str("prompt")
        return Run.objects.filter(pk=slot.int("id"), lease_token=slot.str("token"), ended_at__isnull=True), values
    values = {"id": lease.run.pk, "token": lease.token, "outcome": outcome, "error": error[:2000], "calls": lease.model_calls,
              "tokens": lease.tokens}
    if keep_prompt:
        values["prompt"] = lease.system_prompt
    return compiled(("end-run", keep_prompt), build, ["id"]), values


def finish(lease: RunLease, outcome: str, error: str = "", *, permanent: bool = False, settle: bool = True,
           retry_after: float | None = None) -> None:
    """End the Run row, settle the failure streak, release the slot: all under the lease, or
    nothing at all (LeaseLost) when the watchdog has already ended this run. settle=False (compaction)
    leaves the failure streak as it was."""
    member = lease.member
    if outcome not in (RunOutcome.ERROR, RunOutcome.ABORTED) and lease.can_release_in_fence():
        # The fence statement itself releases the slot and ends the Run row (one statement for three),
        # and looks at the mailbox for the leftover wake below; the rest of the transaction is as below,
        # and a lost lease still writes nothing.
        with lease.fenced(release=end_statement(lease, outcome, error), look=outcome in REWAKE_AFTER):
            if settle:
                failures.clear(member)
            events.emit(member.space_id, "run.ended", member=member, run=lease.run.pk, outcome=outcome, error=error[:300])
        if lease.rewake and wakes.enqueue_wake(member.pk, "message") is False:
            wakes.drop_flag(member.pk)  # nothing is queued: the next ring (or the sweep) tries again
        return
    _finish_after_fence(lease, outcome, error, permanent=permanent, settle=settle, retry_after=retry_after)
    if outcome not in REWAKE_AFTER:
        return  # waiting on a person, paused, over budget or failed: the decision, new mail or the backoff wakes it
    # Mail rung while this run held the flag enqueued nothing: it is this run's to pass on. One
    # statement: flag it and enqueue if the member is idle and active with unread mail.
    wakes.ring([member.pk], "message", leftover=True)


def _finish_after_fence(lease: RunLease, outcome: str, error: str, *, permanent: bool, settle: bool,
                        retry_after: float | None) -> None:
    member = lease.member
    with lease.fenced():
        end_run(lease, outcome, error)
        if outcome == RunOutcome.ERROR:
            write_phase(member, Phase.ERROR)
            failures.record(member, error, permanent=permanent, retry_after=retry_after)
        elif outcome == RunOutcome.ABORTED:
            write_phase(member, Phase.READY)
        elif settle:
            failures.clear(member)
        events.emit(member.space_id, "run.ended", member=member, run=lease.run.pk, outcome=outcome, error=error[:300])
        release(member, lease.token)
