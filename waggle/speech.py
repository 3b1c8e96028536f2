"""How often the model names what it read: the judge's own sensitivity, measured on the model's reads.

The ledger books a replayed step *used* when a later reply draws on a value only its output brought
(:mod:`waggle.evidence`). A model does not name everything it relies on: a read it needed and used
may leave no trace in its text or calls (a *silent read*), and then looks exactly like a read it did
not need. Booking every silent step unused makes the ledger systematically stricter than the truth,
by the share of its reads the model keeps quiet about.

That share is measured, not assumed, per space and per tool (a list the model skims is named less
often than a record it acts on): once a replay fired in a run, each read-only call the model then
makes itself (a *witness*: it asked for it, so it wanted its output) whose output brought specific
values of its own is watched the same way (and so are the reads it made since its last reply
before the replay fired: no reply has seen their outputs yet, so whether one names them is still
to be told); a later reply that draws on it *spoke*; ``s_T`` is
``spoke / witnesses`` for tool T. When a run ends, a route whose replayed steps of tool T were drawn
on ``D_T`` times is owed ``sum D_T * (1 - s_T) / s_T`` steps used in silence; those already inferred
otherwise (a list walked past, a walk continued) count towards it, and the rest is booked on the
route's silent steps of the run that had something to show, earliest first (the rounding remainder
is carried to the route's next runs, at most ``MAX_CARRY`` steps). Credit never crosses routes, and
a route none of whose steps is drawn on earns none: a route that misses is still demoted. A tool
with fewer than ``MIN_WITNESSES`` watched reads, or none named, earns nothing (silence stays unused).

Witnesses are read from the ring, which keeps a JSON output's leaves and a plain-text output's
specific words (``waggle.trace.text_words``): a tool that answers in text is measured like one
that answers in JSON, on the same kind of evidence its replayed steps are judged on.
Limits: kept per process (a run's replies are judged in the process that holds its
slot): a new process starts without a measure.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from waggle import evidence
from waggle.inbound import is_message
from waggle.recorder import Recorder
from waggle.trace import Call, decode_value

MIN_WITNESSES = 5          # reads watched in a space before silence earns credit
MAX_WITNESSES = 64         # watched per session (the first ones after a replay)
HALF_LIFE = 2_000          # a space's tally is halved past this many witnesses (the model may change)
MAX_SESSIONS = 512
MAX_SPACES = 4096
MAX_CARRY = 3              # silent steps a route's drawn steps may owe to its later runs


@dataclass
class _Session:
    started: bool = False                           # the ring was read once (what came before is known)
    upto: int = 0                                   # last ring seq examined for witnesses
    known: set = field(default_factory=set)         # every value the session held up to ``upto``
    watching: list = field(default_factory=list)    # (tool, evidence values) of witnesses not yet drawn on
    heard: dict = field(default_factory=dict)       # tool -> [witnesses, spoke]
    routes: dict = field(default_factory=dict)  # route -> {tool: replayed steps drawn on (the witnesses' test)}
    inferred: dict = field(default_factory=dict)  # route -> steps booked used unnamed (walked past, walk continued)
    unnamed: list = field(default_factory=list)  # (route, tool, evidence, replay position, replayed calls) of those


_sessions: "OrderedDict[tuple[str, str], _Session]" = OrderedDict()
_spaces: "OrderedDict[str, dict]" = OrderedDict()  # space -> {tool: [witnesses, spoke]}
_carry: "OrderedDict[tuple[str, str], float]" = OrderedDict()  # (space, route) -> silent steps owed
_replied: "OrderedDict[tuple[str, str], int]" = OrderedDict()  # (space, session) -> ring seq at its last reply
_lock = threading.Lock()


def _session(space_key: str, session_key: str) -> _Session:
    key = (space_key, session_key)
    with _lock:
        got = _sessions.get(key)
        if got is None:
            got = _sessions[key] = _Session()
            while len(_sessions) > MAX_SESSIONS:
                _sessions.popitem(last=False)
        _sessions.move_to_end(key)
        return got


def watching(space_key: str, session_key: str) -> bool:
    """A replay fired in this session's run: the model's reads are watched to the run's end."""
    return (space_key, session_key) in _sessions


def replied(space_key: str, session_key: str, seq: int | None) -> None:
    """A reply of the session was heard while no replay waited, the ring at ``seq``: the reads
    after it are still to be seen by a reply (None: not known without a query; nothing noted)."""
    if seq is None:
        return
    key = (space_key, session_key)
    with _lock:
        _replied[key] = seq
        _replied.move_to_end(key)
        while len(_replied) > MAX_SESSIONS:
            _replied.popitem(last=False)


def watch(space_key: str, session_key: str, ring: Recorder, since: int | None, replayed: set, said: str) -> None:
    """Called with each judged reply of a run in which a replay fired: take in the model's own
    reads made after ``since`` (the first time: the seq of the session's oldest waiting replay, or
    of the model's last reply before it, when :func:`replied` noted it) that are not in
    ``replayed``, then mark those the reply ``said`` draws on. Each call of the ring is read once
    (what the session knew before a read is kept as it grows)."""
    st = _session(space_key, session_key)
    calls = ring.recent()
    first = ring.last_seq - len(calls) + 1  # seq of calls[0]
    if not st.started:
        st.started = True
        with _lock:
            last_reply = _replied.pop((space_key, session_key), None)
        if since is not None and last_reply is not None:
            since = min(since, last_reply)
        st.upto = first - 1 if since is None else min(since, ring.last_seq)
        for c in calls[: max(0, st.upto - first + 1)]:
            st.known |= evidence.values_of(c)
    for c in calls[max(0, st.upto - first + 1):]:
        if sum(w for w, _ in st.heard.values()) < MAX_WITNESSES and _own_read(c, replayed):
            values = _evidence_of(c, st.known)
            if values:
                st.watching.append((c.tool, values))
                st.heard.setdefault(c.tool, [0, 0])[0] += 1
        st.known |= evidence.values_of(c)
    st.upto = max(st.upto, ring.last_seq)
    if said and st.unnamed:  # a step booked used unnamed that this reply names is drawn on, as a witness is
        left = []
        for route, tool, values, at, made in st.unnamed:
            if evidence.drawn(values, said, learned_since(ring, at, made)):
                mine = st.routes.setdefault(route, {})
                mine[tool] = mine.get(tool, 0) + 1
                st.inferred[route] = st.inferred.get(route, 0) - 1
            else:
                left.append((route, tool, values, at, made))
        st.unnamed = left
    if said and st.watching:
        left = []
        for tool, values in st.watching:
            if evidence.drawn(values, said):
                st.heard[tool][1] += 1
            else:
                left.append((tool, values))
        st.watching = left


def _own_read(c: Call, replayed: set) -> bool:
    return not c.barrier and not is_message(c) and c.invocation() not in replayed


def _evidence_of(c: Call, known: set[str]) -> list[str]:
    """The specific values a call's output brought that nothing before it had (its own arguments aside)."""
    own = {v for v in evidence.values_of(Call(tool=c.tool, args=c.args))}
    out = []
    for v in [decode_value(v) for _, v in c.refs] + list(c.words):
        text = evidence.specific(v)
        if text is not None and text not in own and text not in known and text not in out:
            out.append(text)
            if len(out) >= evidence.MAX_VALUES:
                break
    return out


def booked(space_key: str, session_key: str, route: str, *, drawn: dict[str, int] | None = None,
           inferred: int = 0, unnamed: list[tuple[str, list[str], int, set]] = ()) -> None:
    """Count replayed steps of ``route`` the judge booked used: ``drawn`` (per tool) on a value
    only they brought, ``inferred`` without being named. ``unnamed``: (tool, evidence values,
    replay position, the replay's calls) of the inferred steps that had something to show: a
    witness counts as named when any later reply of the run names it, so such a step a later
    reply names (:func:`watch`) moves from inferred to drawn, and the rate is applied to the
    steps it was measured on."""
    st = _session(space_key, session_key)
    mine = st.routes.setdefault(route, {})
    for tool, n in (drawn or {}).items():
        mine[tool] = mine.get(tool, 0) + n
    st.inferred[route] = st.inferred.get(route, 0) + inferred
    room = max(0, MAX_WITNESSES - len(st.unnamed))
    st.unnamed.extend((route, tool, values, at, made) for tool, values, at, made in list(unnamed)[:room])


def learned_since(ring: Recorder, at: int, replayed: set) -> set[str]:
    """Values the session's own calls and messages brought after position ``at`` (a replay's): a
    reply naming one of them may have drawn on those, not on the replay."""
    calls = ring.recent()
    newer = calls[max(0, len(calls) - max(0, ring.last_seq - at)):] if ring.last_seq > at else []
    out: set[str] = set()
    for c in newer:
        if c.invocation() not in replayed:
            out |= evidence.values_of(c)
    return out


def rate(space_key: str, tool: str) -> tuple[int, int]:
    """The space's (witnesses, spoke) of ``tool`` so far."""
    with _lock:
        got = (_spaces.get(space_key) or {}).get(tool) or [0, 0]
    return got[0], got[1]


def credit(space_key: str, session_key: str, silent: dict[str, int]) -> dict[str, int]:
    """At the run's end: fold the session's witnesses into the space's tally and return, per
    route, how many of its ``silent`` replayed steps (undecided, with something to show) to book
    used (see the module docstring). The model's speech is measured per tool (a list it skims is
    named less than a record it acts on): a tool with fewer than ``MIN_WITNESSES`` watched reads,
    or none named, earns nothing. Credit stays within a route: what a route's drawn steps imply is
    carried to its next runs (at most ``MAX_CARRY`` steps, the rounding remainder below zero), never
    to another route's steps. Forgets the session."""
    with _lock:
        st = _sessions.pop((space_key, session_key), None)
        tally = _spaces.get(space_key) or {}
        for tool, (w, s) in (st.heard.items() if st else ()):
            old = tally.get(tool) or [0, 0]
            new = [old[0] + w, old[1] + s]
            tally[tool] = [new[0] // 2, new[1] // 2] if new[0] > HALF_LIFE else new
        _spaces[space_key] = tally
        _spaces.move_to_end(space_key)
        while len(_spaces) > MAX_SPACES:
            _spaces.popitem(last=False)
        out: dict[str, int] = {}
        for route in sorted(set(silent) | set(st.routes if st else ())):
            owed = 0.0
            for tool, drawn in ((st.routes.get(route) if st else None) or {}).items():
                w, s = tally.get(tool) or (0, 0)
                if w >= MIN_WITNESSES and s > 0:
                    owed += drawn * (w - s) / s
            key = (space_key, route)
            want = _carry.get(key, 0.0) + owed - ((st.inferred.get(route, 0) if st else 0))
            n = min(max(0, silent.get(route, 0)), max(0, int(want + 0.5)))
            _carry[key] = min(float(MAX_CARRY), max(-1.0, want - n))
            _carry.move_to_end(key)
            if n:
                out[route] = n
        while len(_carry) > MAX_SPACES * 4:
            _carry.popitem(last=False)
        return out


def forget() -> None:
    """Drop every tally (tests)."""
    with _lock:
        _sessions.clear()
        _spaces.clear()
        _carry.clear()
        _replied.clear()
