"""Recording: one ring of recent calls per session (cached per process, re-synced from the database), and
`observe`, which records a member's tool call and asks for a sweep.

Split out of waggle.service (which re-exports the public names), one module per verb."""
from __future__ import annotations

import json
import re
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from django.db import connection, transaction
from django.db.models import F, Window
from django.db.models.functions import RowNumber

from waggle.config import WaggleConfig, default_config
from waggle.guard import current as current_guard, write_guard
from waggle.models import FiredPlan, ForageCall
from waggle.recorder import Recorder
from waggle.route import Route
from waggle.window import ROW as _ROW, call_from_row as _call_from_row
from waggle.trace import Call, args_json, clean_text, decode_value, flatten_value, storable
from waggle.common import log
from waggle import sweeping


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


# Sessions whose last pin in this process ended with no replay waiting, at the seq its ring held then.
# A replay fired elsewhere always appends calls to the session (the call or message it followed, its
# steps), so a next pin that finds the session still at that seq knows nothing waits, without a query.
_quiet: "OrderedDict[tuple[str, str], int]" = OrderedDict()


@dataclass
class Seen:
    """A session's ring and whether a replay of it waits, read ahead (read_ahead) for the run that pins it next."""
    ring: Recorder
    last: int
    waits: bool


def read_ahead(sessions: list[tuple[str, str]], *, config: WaggleConfig | None = None) -> dict[tuple[str, str], Seen]:
    """What sync_now reads for each of these sessions, in two statements for all of them: their rings'
    rows (each session's last ring_capacity calls) and which of them a replay waits on. For a host that
    starts many runs at once (a worker resuming its dead predecessor's runs): each run passes its own
    Seen to pinned(), which then reads nothing. True when read: the caller holds the sessions (their
    members' slots) from before this read until their runs pin them."""
    cfg = (config or default_config()).normalized()
    keys = set(sessions)
    if not keys:
        return {}
    spaces, session_keys = {k[0] for k in keys}, {k[1] for k in keys}
    rows: dict[tuple[str, str], list] = {key: [] for key in keys}
    newest_first = Window(RowNumber(), partition_by=[F("space_key"), F("session_key")], order_by=F("seq").desc())
    for space_key, session_key, seq, *row in (ForageCall.objects.filter(space_key__in=spaces, session_key__in=session_keys)
                                             .annotate(nth=newest_first).filter(nth__lte=cfg.ring_capacity)
                                             .values_list("space_key", "session_key", "seq", *_ROW)):
        if (space_key, session_key) in rows:
            rows[(space_key, session_key)].append((seq, *row))
    waiting = set(FiredPlan.objects.filter(space_key__in=spaces, session_key__in=session_keys, settled=False)
                  .values_list("space_key", "session_key").distinct())
    seen = {}
    for key, mine in rows.items():
        mine.sort(key=lambda r: r[0], reverse=True)
        ring = _ring_of(mine, cfg.ring_capacity)
        seen[key] = Seen(ring, ring.last_seq, key in waiting)
    return seen


@contextmanager
def pinned(space_key: str, session_key: str, *, new: bool = False, sync: bool = False,
           seen: Seen | None = None) -> Iterator[None]:
    """The host owns this session for a while (a member's run holds its slot): nobody else appends to
    it meanwhile. Then the ring is trusted after its first sync, the routes are read once, and "no
    replay waiting" is known without a query: a read-only call costs one INSERT instead of about eight
    statements. Routes promoted meanwhile apply from the next pin (the next run).

    ``new``: the host created the session for this run, so it has no calls and no replay yet: its ring
    is known empty without reading it (the session's key must be new, as a database id is).
    ``sync``: read the session's ring and whether a replay waits now (sync_now), not in the host's
    first transaction that observes a call or judges a reply. ``seen``: what read_ahead read of it,
    taken instead of reading."""
    key = (space_key, session_key)
    pin = _pins[key] = _Pin()
    if new:
        _start_empty(key, pin)
    elif seen is not None:
        _keep_ring(key, seen.ring)
        pin.synced, pin.start, pin.none_pending, pin.maybe_pending = True, seen.last, not seen.waits, seen.waits
    elif sync:
        sync_now(space_key, session_key, pin)
    try:
        yield
    except BaseException:
        _forget(key)  # the run failed (maybe its lease was lost, its writes rolled back): read it afresh next time
        raise
    else:
        _remember_quiet(key, pin)
    finally:
        _pins.pop(key, None)


def sync_now(space_key: str, session_key: str, pin: _Pin) -> None:
    """The pinned session's ring and "does a replay wait" read before the host's run writes anything:
    one or two reads of ForageCall (one when this process holds no ring of the session) and, unless
    this process left the session quiet at the seq it still has (_quiet), one of FiredPlan. Read lazily,
    they ran inside the host's first transaction that observed a call (its fence holds a pooled
    connection and the member's row until its commit), as savepointed round trips, and that call's
    row could not ride the host's last statement: a worker that resumed 250 runs of its dead
    predecessor, with no ring of theirs, held each first fence ~3x as long (bench/fleet.py, a worker
    SIGKILLed). Never raises: a failed read leaves the pin unsynced, and the first call reads it then."""
    try:
        _ring(space_key, session_key, default_config().normalized())
        if pin.synced and not pin.none_pending:
            waits = FiredPlan.objects.filter(space_key=space_key, session_key=session_key, settled=False).exists()
            pin.none_pending, pin.maybe_pending = not waits, pin.maybe_pending or waits
    except Exception:  # noqa: BLE001 - best effort by contract
        pin.synced = pin.none_pending = False  # (a read that failed half-way trusts nothing it read)
        log.warning("waggle: could not read the session's ring at its pin (space=%r session=%r); read at its first call",
                    space_key, session_key, exc_info=True)


def _start_empty(key: tuple[str, str], pin: _Pin) -> None:
    """A new session's pin: the ring synced and empty, its episode from seq 0, nothing waiting."""
    pin.synced, pin.start, pin.none_pending = True, 0, True
    _keep_ring(key, Recorder(default_config().normalized().ring_capacity))


def _keep_ring(key: tuple[str, str], ring: Recorder) -> None:
    with _rings_lock:
        _rings[key] = ring
        _rings.move_to_end(key)
        while len(_rings) > _MAX_CACHED_SESSIONS:
            _rings.popitem(last=False)


def _forget(key: tuple[str, str]) -> None:
    with _rings_lock:
        _rings.pop(key, None)
        _quiet.pop(key, None)


def _remember_quiet(key: tuple[str, str], pin: _Pin) -> None:
    """The run ended with no replay waiting (known under the pin): note the seq it ended at."""
    held = _held_seq(*key)
    with _rings_lock:
        if pin.none_pending and pin.synced and held is not None:
            _quiet[key] = held
            _quiet.move_to_end(key)
            while len(_quiet) > _MAX_CACHED_SESSIONS:
                _quiet.popitem(last=False)
        else:
            _quiet.pop(key, None)


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
    rows = None
    if ring is None or ring.capacity != cfg.ring_capacity:  # to be built: its rows tell the last seq too (one read)
        rows = _last_rows(space_key, session_key, cfg.ring_capacity)
        last = rows[0][0] if rows else 0
    else:
        last = (ForageCall.objects.filter(space_key=space_key, session_key=session_key)
                .order_by("-seq").values_list("seq", flat=True).first()) or 0
    if pin is not None:
        pin.synced = True
        if pin.start is None:
            pin.start = last
        with _rings_lock:
            quiet = _quiet.get(key)
        if quiet == last:  # as this process left it, nothing waiting (see _quiet)
            pin.none_pending = True
    if ring is None or ring.last_seq != last or ring.capacity != cfg.ring_capacity:
        ring = _ring_of(rows if rows is not None else _last_rows(space_key, session_key, cfg.ring_capacity), cfg.ring_capacity)
        ring.last_seq = last
        _keep_ring(key, ring)
    return ring


def _ring_of(rows: list, capacity: int) -> Recorder:
    """A ring holding these calls (newest first, as _last_rows reads them); its last_seq the newest's."""
    ring = Recorder(capacity)
    for seq, *row in reversed(rows):
        ring.record(_call_from_row(*row), seq=seq)
    ring.last_seq = rows[0][0] if rows else 0
    return ring


def _last_rows(space_key: str, session_key: str, capacity: int) -> list:
    """The session's last `capacity` calls, newest first: (seq, *window.ROW)."""
    return list(ForageCall.objects.filter(space_key=space_key, session_key=session_key)
                .order_by("-seq").values_list("seq", *_ROW)[:capacity])


def _held_seq(space_key: str, session_key: str) -> int | None:
    """The session's last seq as this process's ring holds it, without a query (None when it holds
    none). Exact while the session is pinned; unpinned, another process may have appended since."""
    with _rings_lock:
        ring = _rings.get((space_key, session_key))
    return ring.last_seq if ring is not None else None


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
                              out_refs=storable(_stored_refs(call))), may_defer=may_defer)
    ring.record(call, seq=seq)
    return seq


def _stored_refs(call: Call) -> list:
    """A call's refs as ForageCall.out_refs keeps them, a plain-text output's words at the empty
    path (no JSON leaf has it: every ref sits under a key or an index; see window.call_from_row)."""
    return [[list(path), value] for path, value in call.refs] + [[[], flatten_value(w)] for w in call.words]


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
                transaction.on_commit(lambda: sweeping._enqueue_sweep(space_key, cfg.sweep_interval))
            else:
                with _contained():  # a failed sweep never takes the recorded call with it
                    sweeping.sweep(space_key, config=cfg)
    except Exception:  # noqa: BLE001 - best effort by contract
        log.exception("waggle: observe failed (space=%r session=%r tool=%r); ignored", space_key, session_key, tool)
