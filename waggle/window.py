"""A space's mining window, kept in memory between sweeps so that a sweep reads only new calls.

A sweep mines the newest ``mine_window`` calls of a space. Reading them all back (and decoding
their JSON) every mine period cost more than the mining itself; ForageCall rows never change once
written, so each process keeps the decoded window and a sweep asks the database only for rows
past the newest one it holds, in one query:

* rows with an id above the newest held one (the new calls);
* the newest held row itself, as an anchor: if it is gone, or a different row now has its id (a
  rolled-back transaction gave the id away again), the cache is dropped and the window read anew;
* ids skipped between two rows read (a transaction that took the id had not committed yet, on
  PostgreSQL; or, more often, the id went to another space): asked for again at the next
  ``GAP_SWEEPS`` refreshes (a commit comes within them), at most ``MAX_GAPS`` of them.

Rows trimmed by retention are the oldest: they leave the window by its size bound alone.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from django.db.models import Q

from waggle.models import ForageCall
from waggle.trace import Call, decode_value, flatten_args, refs_from_json

ROW = ("tool", "args", "mutates", "out_hash", "est_tokens", "out_refs", "oversized")
MAX_SPACES = 64   # windows kept per process (least recently swept dropped first)
MAX_GAPS = 256    # skipped ids still asked for
GAP_SWEEPS = 4    # refreshes a skipped id is asked for


def call_from_row(tool: str, args: Any, mutates: bool, out_hash: str, est_tokens: int, out_refs: Any = (),
                  oversized: bool = False) -> Call:
    refs = refs_from_json(out_refs)  # (a plain-text output's words sit at the empty path: recording._stored_refs)
    words = tuple(str(decode_value(v)) for path, v in refs if not path)
    return Call(tool=tool, args=flatten_args(args if isinstance(args, dict) else {}), mutates=mutates,
                out_hash=out_hash or "", est_tokens=est_tokens or 0, refs=tuple(r for r in refs if r[0]) if words else refs,
                oversized=bool(oversized), words=words)


class Window:
    """The newest ``size`` calls of one space: ``rows`` maps id -> (session, seq, call or None for
    a replayed call), in id order."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.rows: OrderedDict[int, tuple[str, int, Call | None, str]] = OrderedDict()  # (+ out_hash)
        self.anchor: tuple | None = None  # (id, session, seq, out_hash) of the newest row held
        self.gaps: dict[int, int] = {}  # skipped id -> refreshes left
        self.verdicts = None  # the sweep's memo of judged shapes (waggle.service), dropped with the rows
        self.heard = None  # the inbound miner's per-session memo (waggle.inbound.HeardMemo), likewise
        self.grouped = None  # (state, rows by session): the sweep's grouping (waggle.sweeping._by_session)
        self.rows_read = 0  # rows fetched from the database over this window's life (tests count them)

    def _add(self, rid: int, session: str, seq: int, replayed: bool, row: tuple) -> None:
        self.rows[rid] = (session, seq, None if replayed else call_from_row(*row), row[3])
        self.rows_read += 1

    def load(self, space_key: str) -> None:
        got = list(ForageCall.objects.filter(space_key=space_key).order_by("-id")
                   .values_list("id", "session_key", "seq", "replayed", *ROW)[: self.size])
        self.rows.clear()
        self.gaps.clear()
        self.verdicts = None
        self.heard = None
        self.grouped = None
        for rid, session, seq, replayed, *row in reversed(got):
            self._add(rid, session, seq, replayed, row)
        self._set_anchor()

    def _set_anchor(self) -> None:
        if self.rows:
            rid = next(reversed(self.rows))
            session, seq, _, out_hash = self.rows[rid]
            self.anchor = (rid, session, seq, out_hash)
        else:
            self.anchor = None

    def refresh(self, space_key: str) -> bool:
        """Bring the window up to date; False when the cache could not be trusted and was reloaded."""
        if self.anchor is None:
            self.load(space_key)
            return False
        top = self.anchor[0]
        where = Q(id__gte=top)
        if self.gaps:
            where |= Q(id__in=sorted(self.gaps))
        got = list(ForageCall.objects.filter(where, space_key=space_key).order_by("id")
                   .values_list("id", "session_key", "seq", "replayed", *ROW))
        anchor = next((r for r in got if r[0] == top), None)
        if anchor is None or (anchor[0], anchor[1], anchor[2], anchor[7]) != self.anchor:
            self.load(space_key)
            return False
        late = sorted(r for r in got if r[0] in self.gaps)
        new = [r for r in got if r[0] > top]
        self.gaps = {g: left - 1 for g, left in self.gaps.items() if left > 1}
        expect = top + 1
        for rid, *_ in new:
            for g in range(max(expect, rid - MAX_GAPS), rid):
                self.gaps[g] = GAP_SWEEPS
            expect = rid + 1
        for rid, session, seq, replayed, *row in new:
            self._add(rid, session, seq, replayed, row)
        if late:  # a call committed after a later one: put it in its place
            for rid, session, seq, replayed, *row in late:
                self.gaps.pop(rid, None)
                self._add(rid, session, seq, replayed, row)
            self.rows = OrderedDict(sorted(self.rows.items()))
        while len(self.rows) > self.size:
            self.rows.popitem(last=False)
        if self.rows:
            oldest = next(iter(self.rows))
            self.gaps = {g: left for g, left in self.gaps.items() if g > oldest}
        if len(self.gaps) > MAX_GAPS:
            self.gaps = dict(sorted(self.gaps.items())[-MAX_GAPS:])
        self._set_anchor()
        return True

    def drop_before(self, rid: int) -> None:
        """Forget rows below ``rid`` (retention deleted them)."""
        while self.rows and next(iter(self.rows)) < rid:
            self.rows.popitem(last=False)

    def oldest_kept(self, keep: int) -> int | None:
        """The id of the ``keep``-th newest row, when the window holds that many (else None)."""
        if keep > len(self.rows):
            return None
        ids = list(self.rows)
        return ids[-keep]


_windows: OrderedDict[str, Window] = OrderedDict()
_lock = threading.Lock()


def window(space_key: str, size: int) -> Window:
    """The space's window, up to date (one query when it was held; the window read when not)."""
    with _lock:
        w = _windows.get(space_key)
        if w is not None:
            _windows.move_to_end(space_key)
    if w is None or w.size != size:
        w = Window(size)
        w.load(space_key)
    else:
        w.refresh(space_key)
    with _lock:
        _windows[space_key] = w
        _windows.move_to_end(space_key)
        while len(_windows) > MAX_SPACES:
            _windows.popitem(last=False)
    return w


def forget(space_key: str | None = None) -> None:
    """Drop the held window of a space (every space: None)."""
    with _lock:
        if space_key is None:
            _windows.clear()
        else:
            _windows.pop(space_key, None)
