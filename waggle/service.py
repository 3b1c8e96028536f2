"""The interface the host calls. Plain strings, dicts and callables in; nothing from the host is
imported. Everything on a member's path (``observe``, ``follow``) is best effort: an error is
logged and swallowed, never raised into the turn.

Keys: ``space_key`` is the host's space id as a string, ``session_key`` the member-session id,
``member_key`` the member. Space-scoped waggles are only ever seen by their own space; ``global``
waggles (promoted by curation) are seen by every space.
"""
from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections import Counter, OrderedDict
from itertools import takewhile
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import date, datetime, timedelta
from typing import Any, Callable, Iterator

from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import Count, Exists, OuterRef, Q, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from waggle.config import DEFAULT_MIN_FAILS, DEFAULT_STALE_AGE, WaggleConfig, default_config
from waggle import evidence
from waggle.guard import current as current_guard, write_guard
from waggle.miner import Candidate, mine, segments_to_trace
from waggle.inbound import INBOUND_TOOL, is_message, message_call, mine_heard, plan_heard, route_of
from waggle.models import FiredPlan, ForageCall, LedgerEntry, Waggle
from waggle.recorder import Recorder
from waggle.replay import clamp_prefix, estimate_yield, find_plan, plan_key, run_route, run_steps
from waggle.route import (Route, RouteFormatError, TraceIndex, choose_trigger, render_script, steps_summary,
                          wilson_lower, wilson_upper)
from waggle.window import ROW as _ROW, call_from_row as _call_from_row, window as space_window
from waggle.trace import Call, args_json, clean_text, decode_value, flatten_args, flatten_value, refs_from_json, storable

log = logging.getLogger("waggle")

ExecFn = Callable[[str, dict[str, Any]], str]
"""exec(tool_name, args) -> output text. ``args`` keep their JSON types. Raises on a tool error.
The host applies the same safety checks and output truncation as for a model-driven call."""

__all__ = [
    "ExecFn", "WaggleConfig", "WaggleError", "CurateSummary", "observe", "follow", "inbound", "judge_reply", "end_run",
    "settle",
    "list_waggles", "run_waggle", "curate", "saved_tokens_per_day", "sweep",
]


class WaggleError(Exception):
    """A refused on-demand request (unknown or disabled waggle, bad parameters, a failed step)."""


# --------------------------------------------------------------------------------------------
# recorder: one ring per session, cached per process, re-synced from the database when another
# process appended to the same session
# --------------------------------------------------------------------------------------------
_MAX_CACHED_SESSIONS = 512
_rings: "OrderedDict[tuple[str, str], Recorder]" = OrderedDict()
_rings_lock = threading.Lock()
_MUTATOR_ARG_CHARS = 200




@dataclass
class _Pin:
    synced: bool = False  # the ring was checked against the database once under this pin
    routes: "list[Route] | None" = None  # the space's enabled routes, read once under this pin
    none_pending: bool = False  # no replay of the session waits for judgement
    maybe_pending: bool = False  # a replay fired, or one was found waiting, under this pin (end_run looks)
    start: int | None = None  # the session's last seq when the run began: its episode is what follows


_pins: dict[tuple[str, str], _Pin] = {}


@contextmanager
def pinned(space_key: str, session_key: str) -> Iterator[None]:
    """The host owns this session for a while (a member's run holds its slot): nobody else appends to
    it meanwhile. Then the ring is trusted after its first sync, the routes are read once, and "no
    replay waiting" is known without a query: a read-only call costs one INSERT instead of about eight
    statements. Routes promoted meanwhile apply from the next pin (the next run)."""
    key = (space_key, session_key)
    _pins[key] = _Pin()
    try:
        yield
    finally:
        _pins.pop(key, None)


def _ring(space_key: str, session_key: str, cfg: WaggleConfig) -> Recorder:
    """The session's ring, consistent with the database (one indexed query; none when pinned and synced)."""
    key = (space_key, session_key)
    pin = _pins.get(key)
    with _rings_lock:
        ring = _rings.get(key)
        if ring is not None:
            _rings.move_to_end(key)
    if pin is not None and pin.synced and ring is not None and ring.capacity == cfg.ring_capacity:
        return ring
    last = (ForageCall.objects.filter(space_key=space_key, session_key=session_key)
            .order_by("-seq").values_list("seq", flat=True).first()) or 0
    if pin is not None:
        pin.synced = True
        if pin.start is None:
            pin.start = last
    if ring is None or ring.last_seq != last or ring.capacity != cfg.ring_capacity:
        ring = Recorder(cfg.ring_capacity)
        rows = list(ForageCall.objects.filter(space_key=space_key, session_key=session_key)
                    .order_by("-seq").values_list("seq", *_ROW)[: ring.capacity])
        for seq, *row in reversed(rows):
            ring.record(_call_from_row(*row), seq=seq)
        ring.last_seq = last
        with _rings_lock:
            _rings[key] = ring
            _rings.move_to_end(key)
            while len(_rings) > _MAX_CACHED_SESSIONS:
                _rings.popitem(last=False)
    return ring


def _record(space_key: str, session_key: str, member_key: str, call: Call, cfg: WaggleConfig,
            *, replayed: bool = False) -> int:
    """Append a call to the session's ring and to ForageCall; returns its sequence number."""
    ring = _ring(space_key, session_key, cfg)
    seq = ring.last_seq + 1
    if call.barrier:  # a mutator or an oversized call only acts as a barrier; don't keep e.g. file bodies
        args: dict = {k: decode_value(v) if len(v) <= _MUTATOR_ARG_CHARS else v[:_MUTATOR_ARG_CHARS]
                      for k, v in call.args}
    else:
        args = args_json(call.args)
    pin = _pins.get((space_key, session_key))
    # The row may ride in the host's last statement only when nothing reads it back before the commit:
    # the session is pinned and its ring synced (no read of ForageCall decides the next seq) and no
    # inline sweep mines right after this call.
    may_defer = pin is not None and pin.synced and not (cfg.mining and not cfg.sweep_async and seq % cfg.mine_period == 0)
    _insert_forage(ForageCall(space_key=space_key, session_key=session_key, member_key=clean_text(member_key or "")[:64],
                              seq=seq, tool=storable(call.tool[:200]), args=storable(args), mutates=call.mutates,
                              oversized=call.oversized, replayed=replayed, out_hash=call.out_hash, est_tokens=call.est_tokens,
                              out_refs=storable([[list(path), value] for path, value in call.refs])), may_defer=may_defer)
    ring.record(call, seq=seq)
    return seq


_BIG, _INT = 2 ** 63 - 1, 2 ** 31 - 1


def _fits(row: ForageCall) -> bool:
    """Every value fits its column (the checks PostgreSQL would make: lengths, ranges, text without NUL
    that encodes as UTF-8, JSON without NaN), so an INSERT of this row cannot fail on its own data: it
    may then leave its savepoint for the host's last statement. Checked, not assumed from storable()."""
    texts = (row.space_key, row.session_key, row.member_key, row.tool, row.out_hash)
    return (0 < len(row.space_key) <= 64 and 0 < len(row.session_key) <= 64 and len(row.member_key) <= 64
            and len(row.tool) <= 200 and len(row.out_hash) <= 16 and 0 <= row.seq <= _BIG
            and isinstance(row.est_tokens, int) and 0 <= row.est_tokens <= _INT
            and all(isinstance(v, bool) for v in (row.mutates, row.oversized, row.replayed))
            and all(isinstance(t, str) and _clean_text(t) for t in texts)
            and _clean_json(row.args) and _clean_json(row.out_refs))


def _clean_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


def _clean_json(value: Any) -> bool:
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)  # ValueError: NaN, Infinity
    except (TypeError, ValueError):
        return False
    return _clean_text(text) and not _JSON_NUL.search(text)


_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")  # json's escape of a NUL (jsonb refuses it), not an escaped backslash's text


_forage_sql: dict[str, tuple[str, list]] = {}


def _insert_forage(row: ForageCall, *, may_defer: bool = False) -> None:
    """ForageCall.objects.create(), its INSERT written once per backend: one runs per tool call of every
    member, and the ORM's save path (compiling the statement each time) was most of what observing cost.
    Values go through the fields' own pre_save / get_db_prep_save. may_defer: nothing reads the row back
    before the host's transaction ends, so the host's last statement may carry it (see waggle.guard)."""
    guard = current_guard()
    # storable JSON and _fits: the row cannot fail on its own data, so it needs no savepoint of its own
    if guard is not None and may_defer and _fits(row) and guard.defer(ForageCall, [row]):
        return
    cached = _forage_sql.get(connection.vendor)
    if cached is None:
        fields = [f for f in ForageCall._meta.concrete_fields if not f.primary_key]
        qn = connection.ops.quote_name
        sql = (f"INSERT INTO {qn(ForageCall._meta.db_table)} ({', '.join(qn(f.column) for f in fields)}) "
               f"VALUES ({', '.join(['%s'] * len(fields))})")
        cached = _forage_sql[connection.vendor] = (sql, [(f, f.get_internal_type() in _PLAIN) for f in fields])
    sql, fields = cached
    params = []
    for f, plain in fields:
        value = f.pre_save(row, True)
        params.append(value if plain and value is not None else f.get_db_prep_save(value, connection))
    if guard is not None:
        guard.execute(sql, params)
        return
    with connection.cursor() as cur:
        cur.execute(sql, params)


# Columns whose Python value goes to the driver as it is (the field's own preparation is a no-op for them)
_PLAIN = frozenset({"CharField", "TextField", "BooleanField", "IntegerField", "BigIntegerField", "PositiveIntegerField",
                    "PositiveBigIntegerField", "SmallIntegerField"})


def _check_key(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > 64:
        raise ValueError(f"{name} must be a non-empty string of at most 64 characters, got {value!r}")
    return value


def _as_args(args: Any) -> dict:
    """The host should pass a dict; a JSON object string (or any other text) is tolerated."""
    if isinstance(args, dict):
        return args
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
        except ValueError:
            parsed = None
        return parsed if isinstance(parsed, dict) else {"input": args}
    return {} if args is None else {"input": args}


@contextmanager
def _contained() -> Iterator[None]:
    """Inside the host's transaction, run waggle's statements in a savepoint, so a failing one
    is rolled back alone instead of aborting the host's transaction (PostgreSQL). Outside a
    transaction (autocommit) nothing is needed, and no lock is taken."""
    if connection.in_atomic_block:
        with transaction.atomic():
            yield
    else:
        yield


def observe(space_key: str, session_key: str, member_key: str, tool: str, args: dict, mutates: bool,
            output: str, *, config: WaggleConfig | None = None) -> None:
    """Record one completed tool call of a member's session.

    The call goes into the session's ring and into ForageCall (kept for mining across runs,
    bounded by retention). Every ``mine_period`` observations of the session, the space's recent
    calls are mined and at most one new waggle is stored (see :func:`sweep`). Mutating calls are
    recorded too: they block every route window that would contain them.

    Never raises: any error is logged and swallowed.
    """
    try:
        cfg = (config or default_config()).normalized()
        if tool in cfg.ignore_tools:
            return
        _check_key("space_key", space_key)
        _check_key("session_key", session_key)
        call = Call.make(tool, _as_args(args), mutates=mutates,
                         output=output if isinstance(output, str) else str(output or ""))
        with write_guard():  # a savepoint when the host is inside a transaction (PostgreSQL), in the INSERT's round trip
            seq = _record(space_key, session_key, member_key, call, cfg)
        if cfg.mining and seq % cfg.mine_period == 0:
            if cfg.sweep_async:  # off the member's turn: a django-q2 worker mines after the commit
                transaction.on_commit(lambda: _enqueue_sweep(space_key, cfg.sweep_interval))
            else:
                with _contained():  # a failed sweep never takes the recorded call with it
                    sweep(space_key, config=cfg)
    except Exception:  # noqa: BLE001 - best effort by contract
        log.exception("waggle: observe failed (space=%r session=%r tool=%r); ignored", space_key, session_key, tool)


# --------------------------------------------------------------------------------------------
# miner + promoter
# --------------------------------------------------------------------------------------------
def _space_segments(space_key: str, cfg: WaggleConfig, *, messages: bool = False,
                    episodes: list | None = None, held=None) -> list[list[Call | None]]:
    """The space's newest calls, one segment per session in call order. A call a replay made is
    never mining input: it stands as a barrier (no route spans the place where the model relied
    on a replay). Inbound messages are left out, unless ``messages`` (inbound routes are mined
    from messages and calls together). ``episodes``, when given, receives per segment the episode
    of each call: a fingerprint of the inbound message that started it (what the wake brought)."""
    by_session: dict[str, list[tuple[int, Call | None]]] = {}
    held = held or space_window(space_key, cfg.mine_window)  # (held between sweeps: only new rows read)
    for session, seq, call, _ in held.rows.values():
        by_session.setdefault(session, []).append((seq, call))
    segments = []
    for session in sorted(by_session):
        items = sorted(by_session[session], key=lambda t: t[0])
        if messages:
            segments.append([c for _, c in items])
            continue
        seg, marks, episode = [], [], ""
        for _, c in items:
            if is_message(c):
                episode = c.out_hash or hash(c.refs)  # (rows read back keep their refs: the message's words)
                continue
            seg.append(c)
            marks.append(episode)
        if seg:
            segments.append(seg)
            if episodes is not None:
                episodes.append(marks)
    return segments


def promotable(cand: Candidate, index: TraceIndex, cfg: WaggleConfig) -> Route | None:
    """The route to store for a candidate, or None when it is not worth a waggle. It must be
    replayable (some prefix of >= min_prefix steps fully determines a non-empty tail), and in the
    mined calls that prefix must have been followed by the rest of the route at least
    ``min_confidence`` of the time; the shortest such prefix becomes the route's trigger."""
    route = Route.from_candidate(cand, scope=Waggle.SCOPE_SPACE)
    if not route.replayable(cfg.min_prefix):
        return None
    route = choose_trigger(route, index, cfg.min_prefix, cfg.min_confidence, z=cfg.confidence_z,
                           min_contexts=cfg.min_contexts, cap=cfg.fanout_cap)
    if route is None or render_script(route, min_prefix=cfg.min_prefix) is None:
        return None
    return route


_brokers: dict[tuple[int, str], Any] = {}


def _sweep_broker():
    """One django-q2 broker per process (and queue): q2 builds a new one per task by default, which for
    Redis is a new connection, its handshake and the client's version lookup, every mine period."""
    from django_q.brokers import get_broker
    from django_q.conf import Conf

    key = (os.getpid(), Conf.CLUSTER_NAME)  # a forked worker, or a test that renamed the queue, builds its own
    broker = _brokers.get(key)
    if broker is None:
        if len(_brokers) > 16:
            _brokers.clear()
        broker = _brokers[key] = get_broker()
    return broker


_last_enqueued: dict[tuple[int, str], float] = {}


def _enqueue_sweep(space_key: str, interval: float = 0.0) -> None:
    now, key = time.monotonic(), (os.getpid(), space_key)
    if interval and now - _last_enqueued.get(key, -interval) < interval:
        return  # one is queued or just ran: it mines the same window (WaggleConfig.sweep_interval)
    if len(_last_enqueued) > 4096:
        _last_enqueued.clear()
    _last_enqueued[key] = now
    try:
        from django_q.tasks import async_task

        async_task("waggle.service.sweep", space_key,
                   q_options={"task_name": f"waggle-sweep-{space_key}", "broker": _sweep_broker()})
    except Exception:  # noqa: BLE001 - best effort: the next period tries again
        log.warning("waggle: could not enqueue a sweep for space %r", space_key, exc_info=True)


def sweep(space_key: str, *, config: WaggleConfig | None = None) -> Waggle | None:
    """Mine the space's recent calls and store the best new route (at most one per sweep), then
    trim ForageCall to the retention bound. Returns the new waggle, if any. May raise (the
    callers on a member's path catch)."""
    cfg = (config or default_config()).normalized()
    held = space_window(space_key, cfg.mine_window)
    try:
        return _promote_best(space_key, cfg, held) if cfg.mining else None
    finally:  # a failing sweep (say, a value the database refuses) still trims the space
        _trim_space(space_key, cfg, held)


def _promote_best(space_key: str, cfg: WaggleConfig, held=None) -> Waggle | None:
    held = held or space_window(space_key, cfg.mine_window)
    marks: list = []
    segments = _space_segments(space_key, cfg, episodes=marks, held=held)
    trace = segments_to_trace(segments)
    sessions = [n for n, seg in enumerate(segments) for _ in range(len(seg) + (n > 0))]
    episodes = [e for n, seg in enumerate(marks) for e in ([""] if n > 0 else []) + seg]
    candidates = mine(trace, cfg.mine_config)
    created = None
    if candidates:
        own = {name: (count, disabled) for name, count, disabled in Waggle.objects.filter(
            scope=Waggle.SCOPE_SPACE, space_key=space_key).values_list("name", "mined_count", "disabled")}
        known = set(own) | set(Waggle.objects.filter(scope=Waggle.SCOPE_GLOBAL).values_list("name", flat=True))
        index = TraceIndex(trace, sessions, episodes)
        memo = _verdicts_of(space_key, cfg, held)
        judged = 0
        for cand in candidates:
            name = memo.settled(cand)
            if name is False:
                continue  # judged at about this count, in about this window: the same verdict
            route = Route.from_candidate(cand) if name is None else None
            if route is not None and not route.replayable(cfg.min_prefix):
                memo.settle(cand, "")
                continue
            name = name or route.name
            stored = own.get(name)
            if name in known and (stored is None or stored[1] or not _grew(cand.count, stored[0])):
                memo.settle(cand, name)
                continue  # (cheap checks: only routes that reach the trigger test count below)
            judged += 1
            if judged > cfg.sweep_candidates:
                break  # the rest wait for a later sweep: each sweep stays linear in the window
            memo.settle(cand, name)
            if stored is not None:  # seen more often than when it was judged: judge it again
                _rejudge(space_key, name, cand, index, cfg)
                continue
            route = promotable(cand, index, cfg)
            if route is None:
                continue
            script = render_script(route, min_prefix=cfg.min_prefix) or ""
            now = timezone.now()
            try:
                with transaction.atomic():
                    created = Waggle.objects.create(
                        name=route.name, scope=Waggle.SCOPE_SPACE, space_key=space_key, route=route.to_json(),
                        script=script, length=len(route.steps), mined_count=cand.count, created=now, touched=now)
            except (IntegrityError, DatabaseError):  # stored first by another process, or refused
                created = None
                log.warning("waggle: could not store route %s in space %s", route.name, space_key, exc_info=True)
            else:
                log.info("waggle: new route %s in space %s (%d steps, seen %dx, trigger %d, confidence %.0f%%)",
                         route.name, space_key, len(route.steps), cand.count, route.trigger,
                         route.confidence * 100)
            break
    if created is None:
        created = _promote_heard(space_key, cfg, held)
    return created


def _grew(count: int, judged: int) -> bool:
    """Seen enough more often than when last judged to judge again: one more sighting while few,
    an eighth more once many (a full window slides: counts wobble by one without news)."""
    return count >= judged + max(1, judged // 8)


class _Verdicts:
    """What the last sweeps of a space made of each mined shape: (count, route name or "" when
    not replayable, window serial). A candidate seen at a count that has not grown enough since, in
    a window that has not turned over by a quarter, gets the same verdict without being judged
    again (judging is most of a steady-state sweep's cost)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.serial = 0  # rows that entered the window while this memo was kept
        self.last_top: int | None = None
        self.by_shape: dict[tuple, tuple[int, str, int]] = {}

    def advance(self, held) -> None:
        top = held.anchor[0] if held.anchor else None
        if self.last_top is not None and top is not None and top > self.last_top:
            self.serial += sum(1 for _ in takewhile(lambda rid: rid > self.last_top, reversed(held.rows)))
        self.last_top = top

    def settled(self, cand: Candidate):
        """False: skip it (same verdict); its route name when known; None: judge from scratch."""
        got = self.by_shape.get(cand.shape)
        if got is None:
            return None
        count, name, at = got
        if self.serial - at >= self.size // 4 or count != cand.count and _grew(cand.count, count):
            return None
        if count != cand.count and cand.count < count - max(1, count // 8):
            return None  # fell a lot: the window moved on
        return False

    def settle(self, cand: Candidate, name: str) -> None:
        if len(self.by_shape) > 20_000:
            self.by_shape.clear()
        self.by_shape[cand.shape] = (cand.count, name, self.serial)


def _verdicts_of(space_key: str, cfg: WaggleConfig, held) -> _Verdicts:
    """The space's verdict memo, kept with its window (a window read anew starts a new memo)."""
    memo = held.verdicts
    if memo is None:
        memo = held.verdicts = _Verdicts(cfg.mine_window)
    memo.advance(held)
    return memo


def _promote_heard(space_key: str, cfg: WaggleConfig, held=None) -> Waggle | None:
    """Mine inbound routes (calls bound to the message that woke the member: waggle.inbound) and
    store the best new one. A stored one whose learned shape or rivals changed is updated; one the
    larger sample no longer vouches for is disabled."""
    heard = mine_heard(_space_segments(space_key, cfg, messages=True, held=held), min_contexts=cfg.min_contexts,
                       min_confidence=cfg.min_confidence, z=cfg.confidence_z, wilson=wilson_lower)
    own = {name: (disabled, data) for name, disabled, data in Waggle.objects.filter(
        scope=Waggle.SCOPE_SPACE, space_key=space_key, name__startswith="heard.").values_list("name", "disabled", "route")}
    passing = set()
    created = None
    for h in heard:
        route = route_of(h, scope=Waggle.SCOPE_SPACE)
        route = route.with_trigger(0, wilson_lower(h.used, h.contexts, cfg.confidence_z), h.contexts)
        passing.add(route.name)
        data = route.to_json()
        script = render_script(route, min_prefix=cfg.min_prefix) or ""
        now = timezone.now()
        if route.name in own:
            disabled, stored = own[route.name]
            unvouched = isinstance(stored, dict) and stored.get("unvouched")
            if (not disabled and stored != data) or (disabled and unvouched):  # (a demoted one stays off)
                Waggle.objects.filter(scope=Waggle.SCOPE_SPACE, space_key=space_key, name=route.name,
                                      disabled=disabled).update(route=data, script=script, mined_count=h.contexts,
                                                                disabled=False, touched=now)
            continue
        if created is not None:
            continue  # at most one new waggle per sweep
        try:
            with transaction.atomic():
                created = Waggle.objects.create(name=route.name, scope=Waggle.SCOPE_SPACE, space_key=space_key,
                                                route=data, script=script, length=1, mined_count=h.contexts,
                                                created=now, touched=now)
        except (IntegrityError, DatabaseError):
            created = None
            log.warning("waggle: could not store route %s in space %s", route.name, space_key, exc_info=True)
        else:
            log.info("waggle: new inbound route %s in space %s (%d distinct values, %.0f used)",
                     route.name, space_key, h.contexts, h.used)
    # a stored one the larger sample no longer vouches for goes quiet (disabled, marked so: when
    # the evidence vouches again, it comes back; one the ledger demoted does not)
    for name, (disabled, stored) in own.items():
        if disabled or name in passing or not isinstance(stored, dict):
            continue
        Waggle.objects.filter(scope=Waggle.SCOPE_SPACE, space_key=space_key, name=name, disabled=False).update(
            disabled=True, route=stored | {"unvouched": True}, touched=timezone.now())
    return created


def _rejudge(space_key: str, name: str, cand: Candidate, index: TraceIndex, cfg: WaggleConfig) -> None:
    """A stored route was judged on the sightings there were when it first passed (as few as
    ``min_contexts``); judge it again now that it was seen more often. Its trigger, reach and
    evidence follow the larger sample (its live ledger counts are kept and still trim it); when
    the larger sample no longer vouches for any replay, the route is disabled."""
    fresh = promotable(cand, index, cfg)
    with transaction.atomic():
        w = (Waggle.objects.select_for_update()
             .filter(scope=Waggle.SCOPE_SPACE, space_key=space_key, name=name, disabled=False).first())
        if w is None:
            return
        now = timezone.now()
        if fresh is None:
            Waggle.objects.filter(pk=w.pk).update(disabled=True, mined_count=cand.count, touched=now)
            log.info("waggle: disabled %s: seen %dx now, its sightings no longer vouch for a replay", name, cand.count)
            return
        data = fresh.to_json()
        live = (w.route or {}).get("live") if isinstance(w.route, dict) else None
        if live and data.get("reach"):
            data["live"] = live
            data["reach"] = {str(m): r for m, r in sorted(_trimmed_reach(data, cfg).items())}
        Waggle.objects.filter(pk=w.pk).update(route=data, script=render_script(fresh, min_prefix=cfg.min_prefix) or w.script,
                                              mined_count=cand.count, touched=now)


def _trim_space(space_key: str, cfg: WaggleConfig, held=None) -> int:
    if held is not None and cfg.retention_calls <= cfg.mine_window:  # the window holds the edge: no rows read (a delete of nothing is an index probe)
        keep = held.oldest_kept(cfg.retention_calls)
        if keep is None:
            return 0
        deleted, _ = ForageCall.objects.filter(space_key=space_key, id__lt=keep).delete()
        held.drop_before(keep)
        return deleted
    edge = list(ForageCall.objects.filter(space_key=space_key).order_by("-id")
                .values_list("id", flat=True)[cfg.retention_calls: cfg.retention_calls + 1])
    if not edge:
        return 0
    deleted, _ = ForageCall.objects.filter(space_key=space_key, id__lte=edge[0]).delete()
    return deleted


# --------------------------------------------------------------------------------------------
# replayer
# --------------------------------------------------------------------------------------------
def _routes_for(space_key: str) -> list[Route]:
    """Enabled waggles visible in a space: its own, then global ones (a name in both: its own)."""
    rows = (Waggle.objects.filter(disabled=False)
            .filter(Q(scope=Waggle.SCOPE_SPACE, space_key=space_key) | Q(scope=Waggle.SCOPE_GLOBAL))
            .values_list("name", "scope", "route"))
    routes: dict[str, Route] = {}
    for name, scope, data in sorted(rows, key=lambda r: (r[1] != Waggle.SCOPE_SPACE, r[0])):
        if name in routes:
            continue
        try:
            routes[name] = Route.from_json(data, name=name, scope=scope)
        except RouteFormatError:
            log.warning("waggle: skipping unreadable route %s (%s)", name, scope)
    return list(routes.values())


def _ledger(route: Route, space_key: str, session_key: str, steps: int, yield_tokens: int, fail: bool,
            *, on_demand: bool = False, detail: str = "", settled: bool = True) -> LedgerEntry:
    store_key = space_key if route.scope == Waggle.SCOPE_SPACE else ""
    return LedgerEntry.objects.create(name=route.name, scope=route.scope, store_key=store_key, space_key=space_key,
                                      session_key=session_key or "", steps=steps, yield_tokens=max(0, yield_tokens),
                                      fail=fail, on_demand=on_demand, detail=clean_text(detail)[:500],
                                      settled=settled, used_steps=0 if fail or not settled else steps)


def follow(space_key: str, session_key: str, exec: ExecFn, *, config: WaggleConfig | None = None,
           reaches_out: Callable[[str], bool] | None = None) -> str | None:
    """Call after :func:`observe` of a read-only call. If the session's latest calls walked the
    first >= ``min_prefix`` steps of an enabled route of this space (or a global one) and the
    remaining steps are fully determined by the values seen, run those steps through ``exec``
    and return one marked block to append to the triggering tool result::

        [waggle: replayed route NAME — N steps, ~T tokens saved (estimate)]
        --- step 1/N: tool(arg="value")
        ...output...
        [waggle: end of NAME]

    ``reaches_out(tool)`` says which tools reach outside the space (the network, MCP servers not
    declared closed-world; None: none does): a value from a tool's output never becomes their
    argument without the model, so a route replays only up to such a step.

    Returns None when nothing fires. A concrete plan (route + parameter values) fires at most
    once per session, across processes (claimed in the database before it runs). An exec error
    or an empty output yields None and a failure ledger entry. Never raises.
    """
    try:
        cfg = (config or default_config()).normalized()
        _check_key("space_key", space_key)
        _check_key("session_key", session_key)
        pin = _pins.get((space_key, session_key))
        if pin is not None and pin.routes == []:
            return None  # nothing to replay in this space: no savepoint, no query
        with _contained():
            return _follow(space_key, session_key, exec, cfg, reaches_out)
    except Exception:  # noqa: BLE001 - best effort by contract
        log.exception("waggle: follow failed (space=%r session=%r); ignored", space_key, session_key)
        return None


def _session_routes(space_key: str, session_key: str):
    """The space's routes; a pinned session keeps the set it first saw (loaded once for it)."""
    pin = _pins.get((space_key, session_key))
    if pin is None:
        return _routes_for(space_key)
    if pin.routes is None:
        pin.routes = _routes_for(space_key)
    return pin.routes


def _follow(space_key: str, session_key: str, exec: ExecFn, cfg: WaggleConfig,
            reaches_out: Callable[[str], bool] | None = None) -> str | None:
    pin = _pins.get((space_key, session_key))
    routes = _session_routes(space_key, session_key)
    if not routes:
        return None
    ring = _ring(space_key, session_key, cfg)
    # the whole ring (messages aside): routes align with its end; its calls are never replayed again.
    # A run of a long-lived session is its own episode: only its own calls count, and a plan fires
    # once per run (another wake's orientation is made again, and may be replayed again)
    calls = ring.recent()
    episode = pin.start if pin is not None and pin.start is not None else None
    if episode is not None:
        calls = calls[max(0, len(calls) - max(0, ring.last_seq - episode)):]
    recent = [c for c in calls if not is_message(c)]
    if not recent or recent[-1].barrier:
        return None
    plan = find_plan(recent, routes, clamp_prefix(cfg.min_prefix), cap=cfg.fanout_cap, reaches_out=reaches_out)
    if plan is None:
        return None
    key = plan.key if episode is None else plan_key(plan.key, [("(episode)", (("from", str(episode)),))])
    try:
        with transaction.atomic():
            fired = FiredPlan.objects.create(space_key=space_key, session_key=session_key, plan_key=key,
                                             name=plan.route.name, settled=False,
                                             tail=[[tool, dict(args)] for tool, args in plan.tail])
    except IntegrityError:
        return None  # this plan already fired in this session (maybe in another process)
    if pin is not None:
        pin.none_pending, pin.maybe_pending = False, True
    outcome = run_steps(plan.route.name, plan.tail, exec)
    if not outcome.ok:
        _ledger(plan.route, space_key, session_key, plan.steps, 0, True, detail=outcome.error)
        FiredPlan.objects.filter(pk=fired.pk).update(settled=True)
        log.info("waggle: replay of %s failed: %s", plan.route.name, outcome.error)
        return None
    with transaction.atomic():
        # unsettled until the model's next reply says whether it relied on the steps (settle)
        entry = _ledger(plan.route, space_key, session_key, plan.steps, 0, False, settled=False,
                        detail=f"~{outcome.yield_tokens} tokens if every step is used")
        # per step: the call, its yield, its *setting* keys (literal arguments: a reply that asks
        # the same object with other settings contradicts the replay; see judge_reply), and where
        # it stood (alignment, tail position: the ledger judges each position; see _learn_reach)
        known, at = _known(ring), ring.last_seq
        tail = [[tool, dict(args), estimate_yield([(tool, args)], [out]), _setting_keys(plan.route, plan.matched, tool),
                 plan.matched, pos, evidence.step_evidence(args_json(args), out, known), None, at]
                for (tool, args), out, pos in zip(plan.tail, outcome.outputs, plan.positions)]
        FiredPlan.objects.filter(pk=fired.pk).update(ledger_id=entry.pk, tail=tail)
        member = (ForageCall.objects.filter(space_key=space_key, session_key=session_key)
                  .order_by("-seq").values_list("member_key", flat=True).first()) or ""
        for (tool, args), out in zip(plan.tail, outcome.outputs):
            _record(space_key, session_key, member, Call.make(tool, args_json(args), output=out), cfg, replayed=True)
    return outcome.block


def inbound(space_key: str, session_key: str, member_key: str, text: str, exec: ExecFn | None = None, *,
            config: WaggleConfig | None = None) -> str | None:
    """Call when a message reaches the member (a user's message, the mail that woke it), before
    the model reads it. The message is recorded (its tokens, for mining inbound routes: see
    :mod:`waggle.inbound`); if an enabled inbound route fires on it (the message brings the only
    pending value of the route's learned shape), its step runs through ``exec`` and the marked
    block to append to the message is returned, like :func:`follow`'s, to be judged by the model's
    next reply (:func:`judge_reply`). ``exec=None`` only records. Never raises."""
    try:
        cfg = (config or default_config()).normalized()
        _check_key("space_key", space_key)
        _check_key("session_key", session_key)
        with write_guard():
            _record(space_key, session_key, member_key, message_call(text if isinstance(text, str) else ""), cfg)
        if exec is None:
            return None
        pin = _pins.get((space_key, session_key))
        if pin is not None and pin.routes == []:
            return None
        with _contained():
            return _hear(space_key, session_key, member_key, exec, cfg)
    except Exception:  # noqa: BLE001 - best effort by contract
        log.exception("waggle: inbound failed (space=%r session=%r); ignored", space_key, session_key)
        return None


def _hear(space_key: str, session_key: str, member_key: str, exec: ExecFn, cfg: WaggleConfig) -> str | None:
    pin = _pins.get((space_key, session_key))
    routes = _session_routes(space_key, session_key)
    heard = [r for r in routes if r.heard]
    if not heard:
        return None
    got = plan_heard(heard, _ring(space_key, session_key, cfg).recent())
    if got is None:
        return None
    route, call = got
    tail = (call,)
    try:
        with transaction.atomic():
            fired = FiredPlan.objects.create(space_key=space_key, session_key=session_key,
                                             plan_key=plan_key(route.name, tail), name=route.name, settled=False,
                                             tail=[[tool, dict(args)] for tool, args in tail])
    except IntegrityError:
        return None  # already replayed in this session
    if pin is not None:
        pin.none_pending, pin.maybe_pending = False, True
    outcome = run_steps(route.name, tail, exec)
    if not outcome.ok:
        _ledger(route, space_key, session_key, 1, 0, True, detail=outcome.error)
        FiredPlan.objects.filter(pk=fired.pk).update(settled=True)
        log.info("waggle: replay of %s failed: %s", route.name, outcome.error)
        return None
    with transaction.atomic():
        entry = _ledger(route, space_key, session_key, 1, 0, False, settled=False,
                        detail=f"~{outcome.yield_tokens} tokens if the step is used")
        ring = _ring(space_key, session_key, cfg)
        known, at = _known(ring), ring.last_seq
        rows = [[tool, dict(args), estimate_yield([(tool, args)], [out]), _setting_keys(route, 0, tool), -1, -1,
                 evidence.step_evidence(args_json(args), out, known), None, at]
                for (tool, args), out in zip(tail, outcome.outputs)]
        FiredPlan.objects.filter(pk=fired.pk).update(ledger_id=entry.pk, tail=rows)
        for (tool, args), out in zip(tail, outcome.outputs):
            _record(space_key, session_key, member_key, Call.make(tool, args_json(args), output=out), cfg, replayed=True)
    return outcome.block


def _setting_keys(route: Route, matched: int, tool: str) -> list[str]:
    """The literal argument keys of the route's replayed steps of ``tool`` (its settings, as
    opposed to the object a parameter or an output ref names)."""
    return sorted({k for s in route.steps[matched:] if s.tool == tool for k, _ in s.literals})


def _known(ring: Recorder) -> set[str]:
    """Every value the session held (arguments, output leaves, message words): not evidence of use."""
    out: set[str] = set()
    for c in ring.recent():
        out |= evidence.values_of(c)
    return out


def _judge_step(step: list, issued: list[tuple[str, tuple]]) -> str | None:
    """How the model's reply treated one replayed step: ``"re-issued"`` (it made the call itself: it
    ignored the replay), ``"contradicted"`` (it asked the same tool about the same object with other
    settings: the replayed output was not what it needed), or None (neither: see :func:`judge_reply`)."""
    tool, args = step[0], tuple(sorted((step[1] or {}).items()))
    settings = set(step[3]) if len(step) > 3 and isinstance(step[3], list) else set()
    own = dict(args)
    for t, a in issued:
        if t != tool:
            continue
        if a == args:
            return "re-issued"
        other = dict(a)
        if other.keys() != own.keys():
            continue
        differing = {k for k in own if own[k] != other[k]}
        if differing and settings and differing <= settings:
            return "contradicted"
    return None


def _lists(ring: Recorder) -> list[list[str]]:
    """Every list the session's outputs held, as the ordered values at sibling paths (the paths
    that differ only in their last list index)."""
    groups: dict[tuple, list[str]] = {}
    for c in ring.recent():
        for path, value in c.refs:
            at = max((i for i, p in enumerate(path) if isinstance(p, int)), default=None)
            if at is None:
                continue
            key = (c.tool, c.args, path[:at], path[at + 1:])
            groups.setdefault(key, []).append(value)
    return [vals for vals in groups.values() if len(vals) > 1]


def _continued(step: list, issued: list[tuple[str, tuple]], lists: list[list[str]], done: set) -> bool:
    """The reply walks on down the list a replayed fan-out walked: it calls the same tool on a
    later element of the list the step's value came from, every element before that one having
    been replayed or made already. The model took the replayed elements as read (a model that
    wanted only that element would not be walking the list; one that doubted the replay would
    re-issue it)."""
    tool, own = step[0], dict(sorted((step[1] or {}).items()))
    for t, a in issued:
        if t != tool:
            continue
        other = dict(a)
        if other.keys() != own.keys():
            continue
        diff = [k for k in own if own[k] != other[k]]
        if len(diff) != 1:
            continue
        key = diff[0]
        for vals in lists:
            if own[key] not in vals or other[key] not in vals:
                continue
            i, j = vals.index(own[key]), vals.index(other[key])
            if i < j and all((tool, tuple(sorted((own | {key: v}).items()))) in done for v in vals[:j]):
                return True
    return False


def _verdict(step: list) -> str | None:
    return step[7] if len(step) > 7 else None


def _learned_since(ring: Recorder, at: int, replayed: set) -> set[str]:
    """Values the session's own calls and messages brought after position ``at`` (a replay's): a
    reply naming one of them may have drawn on those, not on the replay."""
    calls = ring.recent()
    newer = calls[max(0, len(calls) - max(0, ring.last_seq - at)):] if ring.last_seq > at else []
    out: set[str] = set()
    for c in newer:
        if c.invocation() not in replayed:
            out |= evidence.values_of(c)
    return out


def _pending(space_key: str, session_key: str) -> list[FiredPlan]:
    pin = _pins.get((space_key, session_key))
    if pin is not None and pin.none_pending:
        return []
    rows = list(FiredPlan.objects.filter(space_key=space_key, session_key=session_key, settled=False).order_by("id"))
    if pin is not None:
        pin.none_pending, pin.maybe_pending = not rows, pin.maybe_pending or bool(rows)
    return rows


def judge_reply(space_key: str, session_key: str, calls: list[tuple[str, dict]] | None, *, text: str | None = "",
                config: WaggleConfig | None = None) -> int:
    """Call with each reply of the model while a replay waits for its judgement: the tool calls it
    makes (``[(tool, args), ...]``) and its text. A replayed step is *used* when the reply draws on
    what it returned: its text or its calls' arguments name a value that only the step's output
    brought (an id, a value, a name: see :mod:`waggle.evidence`). It is a *miss* when the model
    issues that call itself, or asks the same tool about the same object with other settings (a
    replayed ``git_log(path=p, limit=5)`` followed by its own ``git_log(path=p, limit=50)``). A
    step the reply does neither for keeps waiting for later replies; the run's end books it unused
    (:func:`end_run`). A replay is settled once each of its steps is decided. Returns how many
    replays were settled. Never raises."""
    try:
        pending = _pending(space_key, session_key)
        if not pending:
            return 0
        cfg = (config or default_config()).normalized()
        issued = [(str(t), flatten_args(a if isinstance(a, dict) else {})) for t, a in (calls or [])]
        said = evidence.reply_text(text if isinstance(text, str) else "", calls or [])
        ring = _ring(space_key, session_key, cfg)
        settled = 0
        lists, done = None, set()
        for fired in pending:
            tail = [list(step) for step in fired.tail]
            replayed = {(str(s[0]), tuple(sorted((s[1] or {}).items()))) for s in tail}  # (args kept as JSON texts)
            changed, since = False, None
            for step in tail:
                if _verdict(step) is not None:
                    continue
                verdict = _judge_step(step, issued)
                if verdict is None and any(t == step[0] for t, _ in issued):
                    if lists is None:
                        lists, done = _lists(ring), {c.invocation() for c in ring.recent()}
                    verdict = "used" if _continued(step, issued, lists, done) else None
                if verdict is None and len(step) > 8 and step[6]:
                    if since is None:
                        since = _learned_since(ring, int(step[8]), replayed)
                    verdict = "used" if evidence.drawn(step[6], said, since) else None
                if verdict is not None:
                    step.extend([None] * (8 - len(step)))  # (a row written before verdicts were kept)
                    step[7], changed = verdict, True
            if all(_verdict(step) is not None for step in tail):
                _close(space_key, session_key, fired, tail, cfg)
                settled += 1
            elif changed:
                FiredPlan.objects.filter(pk=fired.pk, settled=False).update(tail=tail)
        return settled
    except Exception:  # noqa: BLE001 - best effort by contract
        log.exception("waggle: judging a reply failed (space=%r session=%r); ignored", space_key, session_key)
        return 0


def end_run(space_key: str, session_key: str, *, config: WaggleConfig | None = None) -> int:
    """Call when a member's run ends (its last reply given, stopped, failed or waiting): every
    replayed step of the session no reply drew on is booked unused, and its replays settled. A
    session that ends books nothing as used. Returns how many replays were settled. Never raises."""
    try:
        pin = _pins.get((space_key, session_key))
        if pin is not None and not pin.maybe_pending:
            return 0  # nothing fired and nothing was found waiting under this pin: no query
        pending = _pending(space_key, session_key)
        cfg = (config or default_config()).normalized()
        for fired in pending:
            _close(space_key, session_key, fired, [list(step) for step in fired.tail], cfg)
        if pin is not None:
            pin.none_pending, pin.maybe_pending = True, False
        return len(pending)
    except Exception:  # noqa: BLE001 - best effort by contract
        log.exception("waggle: ending a run failed (space=%r session=%r); ignored", space_key, session_key)
        return 0


def _close(space_key: str, session_key: str, fired: FiredPlan, tail: list, cfg: WaggleConfig) -> None:
    """Settle a replay from its steps' verdicts (a step still undecided was not drawn on: unused)."""
    verdicts = [_verdict(step) or "not drawn on" for step in tail]
    for step, verdict in zip(tail, verdicts):  # kept on the row: why each step was booked as it was
        step.extend([None] * (8 - len(step)))
        step[7] = verdict
    fired.tail = tail
    misses = Counter(v for v in verdicts if v != "used")
    why = ", ".join(f"{n} {v}" for v, n in sorted(misses.items()))
    settle(space_key, session_key, [v == "used" for v in verdicts], fired=fired, config=cfg, why=why)


def settle(space_key: str, session_key: str, used: list[bool], *, fired: FiredPlan | None = None,
           config: WaggleConfig | None = None, why: str = "") -> None:
    """Book the oldest unsettled replay of the session (or ``fired``): ``used[i]`` says whether the
    model relied on replayed step i. Used steps earn their estimated yield; a replay with no used
    step is a failure; a route whose misses make its upper bound of use fall below
    ``min_confidence`` is demoted at once (disabled, kept for inspection), and a position that
    did so alone stops being replayed (see :func:`_learn_reach`)."""
    cfg = (config or default_config()).normalized()
    fired = fired or next(iter(_pending(space_key, session_key)), None)
    if fired is None:
        return
    with transaction.atomic():
        if not FiredPlan.objects.filter(pk=fired.pk, settled=False).update(settled=True, tail=fired.tail):
            return  # settled by someone else meanwhile
        entry = LedgerEntry.objects.filter(pk=fired.ledger_id).first() if fired.ledger_id else None
        if entry is None:
            return
        n_used = sum(1 for u in used[: entry.steps] if u)
        yield_tokens = sum(int(step[2]) for step, u in zip(fired.tail, used) if u and len(step) > 2)
        LedgerEntry.objects.filter(pk=entry.pk).update(
            settled=True, used_steps=n_used, fail=n_used == 0, yield_tokens=yield_tokens,
            detail=f"{n_used} of {entry.steps} replayed steps used" + (f" ({why})" if why else ""))
        _learn_reach(entry.scope, entry.store_key, entry.name, fired.tail, used, cfg)
        _demote_if_missing(entry.scope, entry.store_key, entry.name, cfg)


def _learn_reach(scope: str, store_key: str, name: str, tail: list, used: list[bool], cfg: WaggleConfig) -> None:
    """Confidence per step, from the live ledger: count, per (alignment, tail position), the
    replays the model relied on; a position whose upper bound of use, over the contexts it was
    mined from and its live replays together, falls below ``min_confidence`` is no longer
    replayed at that alignment (nor anything after it), while the route's earlier positions keep
    firing. (Routes stored without a reach only demote whole.)"""
    items = [(int(s[4]), int(s[5]), bool(u)) for s, u in zip(tail, used)
             if len(s) > 5 and isinstance(s[4], int) and s[4] >= 0]
    if not items:
        return
    w = Waggle.objects.select_for_update().filter(scope=scope, space_key=store_key, name=name).first()
    if w is None or not isinstance(w.route, dict) or not w.route.get("reach"):
        return
    data = dict(w.route)
    live = {str(k): list(v) for k, v in (data.get("live") or {}).items()}
    for m, pos, u in items:
        offered, ok = live.get(f"{m}:{pos}", [0, 0])
        live[f"{m}:{pos}"] = [offered + 1, ok + u]
    data["live"] = live
    data["reach"] = {str(m): r for m, r in sorted(_trimmed_reach(data, cfg).items())}
    Waggle.objects.filter(pk=w.pk).update(route=data)


def _trimmed_reach(data: dict, cfg: WaggleConfig) -> dict[int, int]:
    """A stored route's reach, cut before the first position of each alignment whose upper bound
    of use over its mined evidence and live replays together is below ``min_confidence``."""
    reach = {int(m): int(r) for m, r in (data.get("reach") or {}).items()}
    mined = data.get("evidence") or {}
    for key, (offered, ok) in (data.get("live") or {}).items():
        m, pos = (int(x) for x in key.split(":"))
        prior = mined.get(key) or [0, 0]
        offered, ok = offered + int(prior[0]), ok + int(prior[1])
        if m in reach and pos < reach[m] and wilson_upper(ok, offered, cfg.confidence_z) < cfg.min_confidence:
            reach[m] = pos
    return reach


def _demote_if_missing(scope: str, store_key: str, name: str, cfg: WaggleConfig) -> bool:
    """Disable the route when, over its settled replays, the upper bound of "step used" is below
    ``min_confidence``: it has shown, beyond small-sample doubt, that it misses too often."""
    agg = LedgerEntry.objects.filter(scope=scope, store_key=store_key, name=name, settled=True,
                                     on_demand=False).aggregate(steps=Sum("steps"), used=Sum("used_steps"))
    steps, used = agg["steps"] or 0, agg["used"] or 0
    if steps == 0 or wilson_upper(used, steps, cfg.confidence_z) >= cfg.min_confidence:
        return False
    changed = Waggle.objects.filter(scope=scope, space_key=store_key, name=name, disabled=False).update(
        disabled=True, touched=timezone.now())
    if changed:
        log.info("waggle: demoted %s (%d of %d replayed steps used)", name, used, steps)
        for pin in list(_pins.values()):  # a demoted route stops replaying in this process at once
            pin.routes = None
    return bool(changed)


# --------------------------------------------------------------------------------------------
# library: list / run on demand / stats
# --------------------------------------------------------------------------------------------
def _stats(where: Q | None = None) -> dict[tuple[str, str, str], dict[str, int]]:
    """(scope, store_key, name) -> {uses, fails, replay_fails, est_tokens_saved, steps_replayed,
    steps_used}, in one query. Replays still waiting for the model's judgement count nowhere."""
    qs = LedgerEntry.objects.filter(settled=True)
    if where is not None:
        qs = qs.filter(where)
    replay = Q(on_demand=False)
    rows = qs.values("scope", "store_key", "name").annotate(
        uses=Count("id", filter=Q(fail=False)),
        fails=Count("id", filter=Q(fail=True)),
        replay_fails=Count("id", filter=Q(fail=True) & replay),
        saved=Sum("yield_tokens", filter=Q(fail=False)),
        steps_replayed=Sum("steps", filter=replay),
        steps_used=Sum("used_steps", filter=replay),
    )
    return {(r["scope"], r["store_key"], r["name"]): {"uses": r["uses"], "fails": r["fails"],
                                                      "replay_fails": r["replay_fails"],
                                                      "est_tokens_saved": r["saved"] or 0,
                                                      "steps_replayed": r["steps_replayed"] or 0,
                                                      "steps_used": r["steps_used"] or 0}
            for r in rows}


def _visible(space_key: str) -> list[Waggle]:
    rows = list(Waggle.objects.filter(Q(scope=Waggle.SCOPE_SPACE, space_key=space_key)
                                      | Q(scope=Waggle.SCOPE_GLOBAL)))
    rows.sort(key=lambda w: (w.scope != Waggle.SCOPE_SPACE, w.name))
    return rows


def list_waggles(space_key: str) -> list[dict]:
    """The waggles a space can use (its own, then global), for the member-facing tool and the
    console. Each dict: ``name``, ``scope``, ``steps`` (one line per step, ``{param}`` marks a
    parameter), ``params`` (name -> example value), ``stats`` (``uses``, ``fails``,
    ``est_tokens_saved`` — an estimate) and ``disabled``."""
    waggles = _visible(space_key)
    stats = _stats(Q(scope=Waggle.SCOPE_SPACE, store_key=space_key) | Q(scope=Waggle.SCOPE_GLOBAL))
    out = []
    for w in waggles:
        try:
            route = Route.from_json(w.route, name=w.name, scope=w.scope)
            steps = steps_summary(route)
            params = {p: decode_value(route.examples[p]) if p in route.examples else "" for p in route.params}
        except RouteFormatError:
            steps, params = ["(unreadable route)"], {}
        st = stats.get((w.scope, w.space_key, w.name), {})
        out.append({
            "name": w.name,
            "scope": w.scope,
            "steps": steps,
            "params": params,
            "stats": {"uses": st.get("uses", 0), "fails": st.get("fails", 0),
                      "steps_replayed": st.get("steps_replayed", 0), "steps_used": st.get("steps_used", 0),
                      "est_tokens_saved": st.get("est_tokens_saved", 0), "yield_is_estimate": True},
            "disabled": w.disabled,
        })
    return out


def run_waggle(space_key: str, name: str, params: dict[str, str], exec: ExecFn, *,
               reaches_out: Callable[[str], bool] | None = None) -> str:
    """Run a waggle on demand with bound parameters; returns the marked block of its outputs.

    Raises WaggleError with a clear message for an unknown or disabled waggle, for missing or
    unknown parameters, and when a step fails (the failure is also recorded in the ledger).
    """
    try:
        _check_key("space_key", space_key)
    except ValueError as exc:
        raise WaggleError(str(exc)) from exc
    if not isinstance(name, str) or not name:
        raise WaggleError("a waggle name (a non-empty string) is required")
    params = {str(k): flatten_value("" if v is None else v) for k, v in (params or {}).items()}
    w = (Waggle.objects.filter(scope=Waggle.SCOPE_SPACE, space_key=space_key, name=name).first()
         or Waggle.objects.filter(scope=Waggle.SCOPE_GLOBAL, name=name).first())
    if w is None:
        known = sorted({x.name for x in _visible(space_key) if not x.disabled})
        hint = f"; available: {', '.join(known[:20])}" if known else "; this space has no waggles yet"
        raise WaggleError(f"unknown waggle {name!r}{hint}")
    if w.disabled:
        raise WaggleError(f"waggle {name!r} is disabled (demoted by curation or by an operator)")
    try:
        route = Route.from_json(w.route, name=w.name, scope=w.scope)
    except RouteFormatError as exc:
        raise WaggleError(f"waggle {name!r} has an unreadable route: {exc}") from exc
    missing = [p for p in route.params if p not in params]
    unknown = sorted(set(params) - set(route.params))
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"missing parameter(s): {', '.join(missing)}")
        if unknown:
            parts.append(f"unknown parameter(s): {', '.join(unknown)}")
        expected = ", ".join(route.params) or "none"
        raise WaggleError(f"waggle {name!r}: {'; '.join(parts)} (expected: {expected})")
    steps, outcome = run_route(route, params, exec, cap=default_config().fanout_cap, reaches_out=reaches_out)
    try:
        _ledger(route, space_key, "", len(steps), outcome.yield_tokens if outcome.ok else 0, not outcome.ok,
                on_demand=True, detail=outcome.error)
    except Exception:  # noqa: BLE001 - the ledger is best effort
        log.exception("waggle: could not record the on-demand run of %s", name)
    if not outcome.ok:
        raise WaggleError(f"waggle {name!r}: {outcome.error}")
    return outcome.block or ""


def saved_tokens_per_day(space_key: str, days: int = 14) -> list[tuple[date, int]]:
    """Estimated tokens saved per day in a space (successful replays and on-demand runs, global
    waggles included), oldest day first, one entry per day including zero days. Estimates only."""
    days = max(1, int(days))
    today = timezone.localdate()
    first = today - timedelta(days=days - 1)
    start = timezone.make_aware(datetime.combine(first, datetime.min.time()))
    rows = (LedgerEntry.objects.filter(space_key=space_key, fail=False, created__gte=start)
            .annotate(day=TruncDate("created")).values("day").annotate(total=Sum("yield_tokens")))
    by_day = {r["day"]: r["total"] or 0 for r in rows}
    return [(first + timedelta(days=i), int(by_day.get(first + timedelta(days=i), 0))) for i in range(days)]


# --------------------------------------------------------------------------------------------
# curation
# --------------------------------------------------------------------------------------------
@dataclass
class CurateSummary:
    gc: int = 0          # removed: unreadable route, no script, or a script already kept
    demoted: int = 0     # newly disabled: >= min_fails replay failures and zero uses
    pruned: int = 0      # removed: zero uses and untouched for longer than stale_age
    compacted: int = 0   # ledger rows dropped because their waggle is gone
    promoted: int = 0    # routes copied to the global scope (present in >= 2 spaces)
    forage_trimmed: int = 0  # ForageCall / FiredPlan rows past retention

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def __str__(self) -> str:
        return ("waggle curate: gc={gc} demoted={demoted} pruned={pruned} compacted={compacted} "
                "promoted={promoted} forage_trimmed={forage_trimmed}").format(**self.as_dict())


def _gc() -> int:
    doomed: list[int] = []
    seen: dict[tuple[str, str], set[str]] = {}
    for wid, scope, space_key, name, data, script in (Waggle.objects.order_by("created", "id")
                                                      .values_list("id", "scope", "space_key", "name", "route", "script")):
        text = (script or "").strip()
        try:
            Route.from_json(data, name=name, scope=scope)
        except RouteFormatError:
            doomed.append(wid)
            continue
        kept = seen.setdefault((scope, space_key), set())
        if not text or text in kept:
            doomed.append(wid)
            continue
        kept.add(text)
    if doomed:
        Waggle.objects.filter(id__in=doomed).delete()
    return len(doomed)


def _demote(now: datetime, min_fails: int) -> int:
    """Routes with >= min_fails failed replays and no use, or whose replayed steps were used so
    rarely that even the upper bound of the use rate is below ``min_confidence``."""
    stats = _stats()
    cfg = default_config()

    def missing(st: dict) -> bool:
        if st["replay_fails"] >= min_fails and st["uses"] == 0:
            return True
        n = st["steps_replayed"]
        return n > 0 and wilson_upper(st["steps_used"], n, cfg.confidence_z) < cfg.min_confidence

    ids = [w.id for w in Waggle.objects.filter(disabled=False).only("id", "scope", "space_key", "name")
           if (st := stats.get((w.scope, w.space_key, w.name))) and missing(st)]
    if not ids:
        return 0
    return Waggle.objects.filter(id__in=ids, disabled=False).update(disabled=True, touched=now)


def _prune(now: datetime, stale_age: timedelta) -> int:
    stats = _stats()
    ids = [w.id for w in Waggle.objects.filter(touched__lt=now - stale_age).only("id", "scope", "space_key", "name")
           if stats.get((w.scope, w.space_key, w.name), {}).get("uses", 0) == 0]
    if not ids:
        return 0
    Waggle.objects.filter(id__in=ids).delete()
    return len(ids)


def _compact() -> int:
    orphan = LedgerEntry.objects.filter(~Exists(Waggle.objects.filter(
        scope=OuterRef("scope"), space_key=OuterRef("store_key"), name=OuterRef("name"))))
    deleted, _ = orphan.delete()
    return deleted


def _promote(now: datetime) -> int:
    present_global = set(Waggle.objects.filter(scope=Waggle.SCOPE_GLOBAL).values_list("name", flat=True))
    by_name: dict[str, list[tuple[str, Any]]] = {}
    for name, space_key, data in (Waggle.objects.filter(scope=Waggle.SCOPE_SPACE, disabled=False)
                                  .order_by("created", "id").values_list("name", "space_key", "route")):
        if name not in present_global:
            by_name.setdefault(name, []).append((space_key, data))
    promoted = 0
    for name, copies in sorted(by_name.items()):
        try:
            routes = [(sk, Route.from_json(d, name=name, scope=Waggle.SCOPE_GLOBAL)) for sk, d in copies]
        except RouteFormatError:
            continue
        # the same name is the same content for mined routes; check anyway, never merge differing routes
        first = routes[0][1]
        spaces = {sk for sk, r in routes if r.content_hash() == first.content_hash()}
        if len(spaces) < 2:
            continue
        script = render_script(first) or ""
        try:
            with transaction.atomic():
                Waggle.objects.create(name=name, scope=Waggle.SCOPE_GLOBAL, space_key="", route=first.to_json(),
                                      script=script, length=len(first.steps), mined_count=first.count,
                                      created=now, touched=now)
        except IntegrityError:
            continue
        promoted += 1
    return promoted


def _trim_old(now: datetime, retention: timedelta) -> int:
    a, _ = ForageCall.objects.filter(created__lt=now - retention).delete()
    b, _ = FiredPlan.objects.filter(created__lt=now - retention).delete()
    return a + b


def curate(now: datetime | None = None, *, stale_age: timedelta = DEFAULT_STALE_AGE,
           min_fails: int = DEFAULT_MIN_FAILS) -> CurateSummary:
    """Library maintenance over every scope, in this order (each step relies on the one before):

    1. GC: drop waggles with an unreadable route, no script, or a script already kept in the
       same store.
    2. Demote: disable waggles with >= ``min_fails`` replay failures and zero uses (kept for
       inspection; the demotion refreshes ``touched``).
    3. Prune: delete waggles with zero uses untouched for longer than ``stale_age`` — a waggle
       demoted just now survives this pass.
    4. Compact: drop ledger rows whose waggle is gone, so a re-mined route starts clean.
    5. Promote: copy a route present (enabled) in >= 2 spaces to the global scope, unless it is
       already there.

    Then ForageCall / FiredPlan rows past retention are dropped. Logs and returns the counts.
    Idempotent: a second pass with the same ``now`` changes nothing.
    """
    now = now or timezone.now()
    cfg = default_config()
    summary = CurateSummary()
    with transaction.atomic():
        summary.gc = _gc()
    with transaction.atomic():
        summary.demoted = _demote(now, max(1, int(min_fails)))
    with transaction.atomic():
        summary.pruned = _prune(now, stale_age)
    with transaction.atomic():
        summary.compacted = _compact()
    with transaction.atomic():
        summary.promoted = _promote(now)
    with transaction.atomic():
        summary.forage_trimmed = _trim_old(now, cfg.retention)
    log.info("%s", summary)
    return summary
