"""Calls bound to the message that woke the member (pure Python, no ORM).

Agents take many arguments straight from what they were told: "my user id is mia_li_3668" is
followed by ``get_user_details(user_id="mia_li_3668")``, "look at src/foo.py" by
``read_file(path="src/foo.py")``. A route of this kind (an *inbound route*) has one step, and one
of its arguments is *heard*: bound to a token of the inbound message (the host passes the text in:
a user's message, the mail that woke a member). Its trigger is "an inbound message carrying a
token of the learned *shape*".

* **Tokens** of a message: its whitespace-separated words with surrounding punctuation stripped
  (``"src/foo.py."`` gives ``src/foo.py``), and the parts of a word joined by ``@`` (an email
  address's local part is often the member's id), distinct, at most ``MAX_TOKENS`` of at most
  ``MAX_TOKEN_CHARS`` characters each (a huge or odd token is simply not a candidate).
* A **shape** is learned from the values the argument took in the mined sessions, never the values
  themselves: the character classes every value had (upper, lower, digit, or the punctuation
  character itself), the classes any value had, and the range of lengths, widened by its spread
  when the lengths varied (a fixed length is kept). ``mia_li_3668`` and ``noah_smith_1234`` give
  "lower, ``_`` and digits, 7-19 characters"; ``JG7FMM`` and ``H8Q05L`` "upper and digits, 6".
* **Pending values**: the tokens of the session's inbound messages that fit any learned shape (the
  route's own, or a *rival*: the shape of another heard argument mined in the same space) and that
  no call of the session has used as an argument yet. The route fires only when exactly one value
  is pending, it is in the message just received, and it fits this route's shape and no other
  inbound route's: when the agent was told several things it could look up, waggle does not guess
  which it will look up first.
* A **joined** inbound route: where the message alone does not vouch for the call (the user names
  a reservation before they are known: the agent asks who they are first; a flight number has the
  same shape as a reservation id), the route may still vouch for it *after the session's own
  record listed the value*: the heard value must also stand in an earlier output of the session at
  the place the mined lookups found it (``get_user_details`` output ``.reservations[]``), and a
  value of the route's shape that no such output listed is not a candidate at all (a flight
  number is not a reservation of this user). The message and an output must agree; neither alone
  names the argument. The join completes where the second of them arrives: at the message, or at
  the output when the user named the value first and the agent looked them up before using it
  (``follow`` fires it after that output: :func:`plan_joined`). It is judged on its own
  sightings, at both places, and only for a lookup the message alone does not vouch for (the
  plain rule fires more often when it passes).
* **Confidence** is judged exactly that way on the mined sessions: per distinct value (the four
  near-copies of a task count once), was the agent's next call the replayed one? The Wilson lower
  bound of that share over the distinct values must reach ``min_confidence``, over at least
  ``min_contexts`` of them, as for every other route.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from waggle.shape import TokenShape
from waggle.route import Route, Step
from waggle.trace import Call, clean_text, decode_value, flatten_value

INBOUND_TOOL = "(inbound message)"  # a recorded message, not a call: no vendor allows this tool name
MAX_TOKENS = 400                    # tokens of one message kept (the first ones, distinct)
MAX_TOKEN_CHARS = 200               # a longer word is not a candidate value
MAX_MESSAGE_CHARS = 200_000         # only the start of a longer message is read
_STRIP = ".,;:!?()[]{}<>\"'`*«»“”‘’"


def tokens(text: Any) -> list[str]:
    """The candidate values of a message, in order, distinct (see the module docstring)."""
    if not isinstance(text, str) or not text:
        return []
    text = clean_text(text[:MAX_MESSAGE_CHARS])
    out: list[str] = []
    seen: set[str] = set()
    for whole in text.split():
        whole = whole.strip(_STRIP)
        # the parts of an address are values too: the agent told "mia_li_3668@example.com" looks
        # the member up as mia_li_3668 (a handle's local part, a package@version's name)
        for word in [whole] + ([w.strip(_STRIP) for w in whole.split("@")] if "@" in whole else []):
            if not word or len(word) > MAX_TOKEN_CHARS or word in seen:
                continue
            seen.add(word)
            out.append(word)
        if len(out) >= MAX_TOKENS:
            break
    return out[:MAX_TOKENS]


def message_call(text: Any) -> Call:
    """A message as a recorded event: its tokens are kept as the refs of a pseudo-call."""
    return Call(tool=INBOUND_TOOL, refs=tuple((("token", i), flatten_value(t)) for i, t in enumerate(tokens(text))))


def is_message(call: Call | None) -> bool:
    return call is not None and call.tool == INBOUND_TOOL


def message_tokens(call: Call) -> list[str]:
    out = []
    for _, value in call.refs:
        v = decode_value(value)
        if isinstance(v, str):
            out.append(v)
    return out


Source = tuple  # (tool, output path with list indexes as "*"): where a heard value also stood


def pattern(path: Sequence) -> tuple:
    return tuple("*" if isinstance(p, int) else p for p in path)


def _at(call: Call, source: Source) -> set[str]:
    """The JSON texts of the leaves a call's output held at ``source`` (compared as texts: no
    output is parsed again)."""
    if call.tool != source[0]:
        return set()
    want = source[1]
    return {v for path, v in call.refs if len(path) == len(want) and pattern(path) == want}


def listed_at(events: Sequence[Call | None], source: Source) -> set[str]:
    """The values (as JSON texts) the outputs in ``events`` held at ``source``."""
    out: set[str] = set()
    for c in events:
        if c is not None and not is_message(c):
            out |= _at(c, source)
    return out


class _Places:
    """Where each output leaf of a session's calls stood, (tool, path) by JSON text, built only as
    far as asked (most sessions never ask: mining stays linear in what it must read)."""

    def __init__(self, seg: Sequence[Call | None]) -> None:
        self.seg, self.upto, self.where = seg, 0, {}

    def sources(self, text: str, before: int) -> set[Source]:
        for c in self.seg[self.upto:before]:
            if c is not None and not is_message(c):
                for path, v in c.refs:
                    self.where.setdefault(v, []).append((c.tool, path))
        self.upto = max(self.upto, before)
        return {(tool, pattern(path)) for tool, path in self.where.get(text, ())}


def used_values(calls: Iterable[Call]) -> set[str]:
    """String argument values of the calls (what the session has already looked up)."""
    out: set[str] = set()
    for c in calls:
        if c is None or is_message(c):
            continue
        for _, v in c.args:
            d = decode_value(v)
            if isinstance(d, str):
                out.add(d)
    return out


def pending(events: Sequence[Call | None], shapes: Sequence[TokenShape]) -> list[str]:
    """Tokens of the messages in ``events`` fitting any of ``shapes`` that no call in ``events``
    used as an argument value, in order."""
    used = used_values(events)
    out: list[str] = []
    seen: set[str] = set()
    for c in events:
        if not is_message(c):
            continue
        for t in message_tokens(c):  # type: ignore[arg-type]
            if t in seen or t in used:
                continue
            if any(s.fits(t) for s in shapes):
                seen.add(t)
                out.append(t)
    return out


@dataclass(frozen=True)
class Heard:
    """A mined inbound route before it is stored: call ``tool`` with ``literals`` and ``key`` bound
    to the message's token; judged on ``contexts`` distinct values of which ``used`` were followed
    by that very call."""

    tool: str
    key: str
    literals: tuple[tuple[str, str], ...]
    shape: TokenShape
    rivals: tuple[TokenShape, ...]
    contexts: int  # distinct values it was judged on
    used: float    # sum over them of the share of sightings followed by the call
    example: str = ""
    source: Source = ()  # a joined route: where an earlier output must also list the value


def choose(candidates: Sequence[tuple[str, str, tuple]], shapes: Mapping, rivals: Sequence[TokenShape],
           events: Sequence[Call | None], message_at: int) -> tuple[list[int], str] | None:
    """The candidates whose shape the message at ``events[message_at]`` fits (their indexes, and
    the token), or None: exactly one value pending over ``shapes`` and ``rivals``, in that message."""
    upto = events[: message_at + 1]
    allshapes = list(shapes.values()) + list(rivals)
    left = pending(upto, allshapes)
    if len(left) != 1:
        return None
    token = left[0]
    msg = events[message_at]
    if msg is None or token not in message_tokens(msg):
        return None
    fitting = [i for i, cand in enumerate(candidates) if shapes[cand].fits(token)]
    return (fitting, token) if fitting else None


def concrete(tool: str, key: str, literals: Sequence[tuple[str, str]], token: str) -> tuple[str, tuple]:
    return (tool, tuple(sorted(list(literals) + [(key, flatten_value(token))])))


class HeardMemo:
    """What :func:`mine_heard` found in each session, kept between sweeps (a sweep then reads only
    the sessions that changed: a steady-state sweep stays cheap). Keyed by a caller's key that
    changes whenever a session's events do (its first and last seq and its length); the second
    pass's result also by the shapes, rivals and sources it was computed with. Entries of sessions
    not passed in are dropped at each call."""

    def __init__(self) -> None:
        self.sightings: dict = {}  # key -> the session's sightings (pass 1)
        self.evidence: dict = {}   # key -> (model, the session's evidence) (pass 2)


def _sightings(seg: Sequence[Call | None]) -> tuple[dict, dict, dict]:
    """Pass 1 on one session: each argument value that is a token of an earlier message of the
    session and still pending there, by (tool, key), by (tool, key, other literals), and by the
    output places that also held it."""
    values: dict[tuple[str, str], set[str]] = {}
    groups: dict[tuple[str, str, tuple], set[str]] = {}
    found: dict[tuple[str, str, tuple], dict[Source, set[str]]] = {}  # ... that an earlier output also held
    heard: set[str] = set()
    used: set[str] = set()
    places = _Places(seg)
    for j, c in enumerate(seg):
        if c is None:
            continue
        if is_message(c):
            heard.update(message_tokens(c))
            continue
        before = set(used)
        used |= used_values([c])
        if not c.barrier:
            for key, v in c.args:
                d = decode_value(v)
                if isinstance(d, str) and d in heard and d not in before:  # (a value still pending)
                    values.setdefault((c.tool, key), set()).add(d)
                    lits = tuple((k, x) for k, x in c.args if k != key)
                    groups.setdefault((c.tool, key, lits), set()).add(d)
                    for src in places.sources(v, j):
                        found.setdefault((c.tool, key, lits), {}).setdefault(src, set()).add(d)
    return values, groups, found


def _evidence(seg: Sequence[Call | None], cands: list, shapes: Mapping, rivals: tuple,
              sources: Mapping[int, Source]) -> tuple[dict, dict, dict]:
    """Pass 2 on one session: replay the rule at each message (what :func:`choose` computes there,
    kept up to date in one pass), and the joined rule also at each output of its source's tool
    (where the join may complete). Per candidate index, per distinct value: [sightings, followed
    by the call]; the same for the joined rule; the first value each candidate was seen on."""
    seen: dict[int, dict[str, list[int]]] = {}
    joined: dict[int, dict[str, list[int]]] = {}
    examples: dict[int, str] = {}
    allshapes = list(shapes.values()) + list(rivals)
    following: list = [False] * (len(seg) + 1)  # the next event that is a call (or a replay's None)
    for at in range(len(seg) - 1, -1, -1):
        x = seg[at]
        following[at] = x if (x is None or not is_message(x)) else following[at + 1]
    used: set[str] = set()
    made: set = set()
    said: set[str] = set()      # tokens of the messages so far that fit a shape
    waiting: set[str] = set()   # ... and that no call has used yet
    listed: dict[Source, set[str]] = {src: set() for src in set(sources.values())}  # (as JSON texts)
    for at, c in enumerate(seg):
        if c is None:
            continue
        if not is_message(c):
            values = used_values([c])
            used |= values
            waiting -= values
            made.add(c.invocation())
            for src, texts in listed.items():
                texts |= _at(c, src)
            nxt = following[at + 1]
            for i, src in sources.items():  # the joined rule where the join completes at this output
                if c.tool != src[0] or nxt is None:
                    continue
                token = _left_one(waiting, shapes[cands[i]], listed[src], _at(c, src))
                if token is not None and (step := concrete(*cands[i], token)) not in made:
                    t = joined.setdefault(i, {}).setdefault(token, [0, 0])
                    t[0] += 1
                    t[1] += nxt is not False and nxt.invocation() == step
            continue
        toks = message_tokens(c)
        for t in toks:
            if t not in said and any(sh.fits(t) for sh in allshapes):
                said.add(t)
                if t not in used:
                    waiting.add(t)
        nxt = following[at + 1]
        if nxt is None:
            continue  # a replay stood there (not mining input): no evidence either way
        heard_now = {flatten_value(t) for t in toks} if sources else set()
        for i, src in sources.items():  # the joined rule: a value of its shape no output listed is no candidate
            token = _left_one(waiting, shapes[cands[i]], listed[src], heard_now)
            if token is not None and (step := concrete(*cands[i], token)) not in made:
                t = joined.setdefault(i, {}).setdefault(token, [0, 0])
                t[0] += 1
                t[1] += nxt is not False and nxt.invocation() == step
        if len(waiting) != 1:
            continue
        (token,) = waiting
        if token not in toks:
            continue
        for i, cand in enumerate(cands):  # each candidate judged as if it were the only route of its shape
            if not shapes[cand].fits(token):
                continue
            tool, key, lits = cand
            step = concrete(tool, key, lits, token)
            if step in made:
                continue
            t = seen.setdefault(i, {}).setdefault(token, [0, 0])
            t[0] += 1  # the session ending without the call is a miss
            t[1] += nxt is not False and nxt.invocation() == step
            examples.setdefault(i, token)
    return seen, joined, examples


def _left_one(waiting: Iterable[str], shape: TokenShape, listed: set[str], new: set[str]) -> str | None:
    """The joined rule: the only value still waiting once those of ``shape`` that no output listed
    (``listed``, JSON texts) are set aside, when it has ``shape`` and is among ``new`` (JSON texts:
    the message just heard, or the output just read: where the join completes); else None."""
    left = [t for t in waiting if not (shape.fits(t) and flatten_value(t) not in listed)]
    if len(left) != 1 or not shape.fits(left[0]) or flatten_value(left[0]) not in new:
        return None
    return left[0]


def _cached(memo: "HeardMemo | None", keys: Sequence | None, table: str, segments: Sequence, compute,
            model: Any = None) -> list:
    """Each segment's result of ``compute`` (from ``memo``'s ``table`` when its key and ``model``
    match; entries of keys not passed in are dropped)."""
    if memo is None or keys is None:
        return [compute(seg) for seg in segments]
    old, fresh, out = getattr(memo, table), {}, []
    for key, seg in zip(keys, segments):
        got = old.get(key)
        if got is None or got[0] != model:
            got = (model, compute(seg))
        fresh[key] = got
        out.append(got[1])
    setattr(memo, table, fresh)
    return out


def mine_heard(segments: Sequence[Sequence[Call | None]], *, min_contexts: int, min_confidence: float,
               z: float, wilson, keys: Sequence | None = None, memo: HeardMemo | None = None) -> list[Heard]:
    """Inbound routes in ``segments`` (one per session: messages and calls in order; None entries
    are calls that may not be mined, e.g. a replay's), best first (most contexts used). Linear in
    the number of events times the shapes learned (a handful). With ``keys`` (one per segment,
    changing whenever its segment does) and a ``memo`` kept between calls, a session already read
    is not read again (the same result: tests compare)."""
    if keys is not None and len(keys) != len(segments):
        raise ValueError("mine_heard: one key per segment")
    # 1. sightings: an argument value that is a token of an earlier message of the session
    values: dict[tuple[str, str], set[str]] = {}
    groups: dict[tuple[str, str, tuple], set[str]] = {}
    found: dict[tuple[str, str, tuple], dict[Source, set[str]]] = {}
    for v1, g1, f1 in _cached(memo, keys, "sightings", segments, _sightings):
        for arg, vals in v1.items():
            values.setdefault(arg, set()).update(vals)
        for g, vals in g1.items():
            groups.setdefault(g, set()).update(vals)
        for g, by_src in f1.items():
            mine = found.setdefault(g, {})
            for src, vals in by_src.items():
                mine.setdefault(src, set()).update(vals)
    shapes_by_arg = {arg: TokenShape.learn(sorted(vals)) for arg, vals in values.items()
                     if len(vals) >= max(1, min_contexts)}
    shapes_by_arg = {arg: s for arg, s in shapes_by_arg.items() if s is not None}
    cands = [g for g, vals in groups.items() if len(vals) >= max(1, min_contexts) and (g[0], g[1]) in shapes_by_arg]
    if not cands:
        if memo is not None and keys is not None:
            memo.evidence = {}
        return []
    cands.sort()
    shapes = {g: shapes_by_arg[(g[0], g[1])] for g in cands}
    # the rivals: values another candidate would look up (a heard argument whose other arguments
    # vary, say a flight search's dates, is no candidate and competes with nothing)
    rivals = tuple(dict.fromkeys(shapes[g] for g in cands))
    # a candidate's source: the output place that held the most of its heard values (enough of them)
    sources: dict[int, Source] = {}
    for i, g in enumerate(cands):
        held = [(len(vals), src) for src, vals in (found.get(g) or {}).items() if len(vals) >= max(1, min_contexts)]
        if held:
            sources[i] = max(held, key=lambda t: (t[0], repr(t[1])))[1]
    # 2. evidence: replay the rule on every message; the unit is the distinct value (near-copies of
    # one task count once, by the share of their sightings that were followed by the call)
    model = (tuple(cands), tuple(shapes[g] for g in cands), rivals, tuple(sorted(sources.items())))
    seen: dict[int, dict[str, list[int]]] = {i: {} for i in range(len(cands))}
    joined: dict[int, dict[str, list[int]]] = {i: {} for i in sources}  # the joined rule's sightings
    examples: dict[int, str] = {}
    per_session = _cached(memo, keys, "evidence", segments,
                          lambda seg: _evidence(seg, cands, shapes, rivals, sources), model)
    for s1, j1, e1 in per_session:
        for into, part in ((seen, s1), (joined, j1)):
            for i, by_token in part.items():
                mine = into[i]
                for token, (k, u) in by_token.items():
                    t = mine.setdefault(token, [0, 0])
                    t[0] += k
                    t[1] += u
        for i, token in e1.items():
            examples.setdefault(i, token)
    out = []
    for i, (tool, key, lits) in enumerate(cands):
        source: Source = ()
        n = len(seen[i])
        used = sum(u / k for k, u in seen[i].values())
        if n < max(1, min_contexts) or wilson(used, n, z) < min_confidence:
            # the message alone does not vouch for it: does it once an output agrees?
            tally = joined.get(i) or {}
            n, used = len(tally), sum(u / k for k, u in tally.values())
            if i not in sources or n < max(1, min_contexts) or wilson(used, n, z) < min_confidence:
                continue
            source = sources[i]
        out.append(Heard(tool=tool, key=key, literals=lits, shape=shapes[cands[i]],
                         rivals=tuple(r for r in rivals if r != shapes[cands[i]]), contexts=int(n), used=used,
                         example=examples.get(i, ""), source=source))
    out.sort(key=lambda h: (-h.used, h.tool, h.key))
    return out


def route_of(h: Heard, scope: str = "space"):
    """The stored form of a mined inbound route (a one-step :class:`waggle.route.Route`)."""
    from dataclasses import replace as _replace


    step = Step(tool=h.tool, literals=tuple(sorted(h.literals)), binds=((h.key, h.key),))
    route = Route(steps=(step,), params=(h.key,), scope=scope, examples={h.key: flatten_value(h.example)} if h.example else {},
                  count=h.contexts, heard=(h.key,), shapes={h.key: h.shape}, rivals=h.rivals, source=h.source)
    return _replace(route, name="heard." + route.stable_name())


def plan_heard(routes: Sequence, events: Sequence[Call]) -> "tuple[Any, tuple[str, tuple]] | None":
    """The inbound route to replay on the message that ends ``events`` (the session's recent
    messages and calls, oldest first), with its concrete call; None when none fires (see the
    module docstring: exactly one pending value over every shape the routes know; a joined route
    counts only the values of its shape an earlier output listed at its source)."""
    heard = [r for r in routes if getattr(r, "heard", ()) and len(r.heard) == 1 and len(r.steps) == 1]
    if not heard or not events or not is_message(events[-1]):
        return None
    rivals: list[TokenShape] = []
    for r in heard:
        rivals.extend(x for x in r.rivals if x not in rivals)
    made = {c.invocation() for c in events if c is not None and not is_message(c)}
    plain = [r for r in heard if not r.source]
    cands = [(r.steps[0].tool, r.heard[0], r.name) for r in plain]
    shapes = {c: r.shapes[r.heard[0]] for c, r in zip(cands, plain)}
    others = rivals + [r.shapes[r.heard[0]] for r in heard if r.source]  # (a joined route's shape still competes)
    got = choose(cands, shapes, others, events, len(events) - 1) if plain else None
    if got is not None:
        if len(got[0]) != 1 or any(r.shapes[r.heard[0]].fits(got[1]) for r in heard if r.source):
            return None  # two routes would take the value: no guess
        route, token = plain[got[0][0]], got[1]
    else:
        allshapes = [r.shapes[r.heard[0]] for r in heard] + rivals
        fired = [(r, t) for r in heard if r.source and (t := _joined_token(r, events, allshapes)) is not None]
        if len(fired) != 1:
            return None
        route, token = fired[0]
    step = route.steps[0]
    call = concrete(step.tool, route.heard[0], step.literals, token)
    return None if call in made else (route, call)


def _joined_token(route, events: Sequence[Call], allshapes: Sequence[TokenShape]) -> str | None:
    """The value a joined route would take from the message or the output ending ``events``: the
    only pending one once values of its shape that no earlier output listed at its source are set
    aside; it must be in that message, or listed by that output (where the join completes)."""
    last = events[-1]
    new = ({flatten_value(t) for t in message_tokens(last)} if is_message(last) else _at(last, route.source))
    return _left_one(pending(events, allshapes), route.shapes[route.heard[0]], listed_at(events, route.source), new)


def plan_joined(routes: Sequence, events: Sequence[Call]) -> "tuple[Any, tuple[str, tuple]] | None":
    """The joined inbound route to replay after the output that ends ``events`` (a read-only call
    of the session), with its concrete call; None when none fires. The message named the value
    before the session's own record listed it (the user names a reservation, the agent first
    asks who they are, as its policy wants): the join completes at the output, and the rule is the
    one :func:`plan_heard` applies at a message (mined and judged at both places alike)."""
    heard = [r for r in routes if getattr(r, "heard", ()) and len(r.heard) == 1 and len(r.steps) == 1]
    if not events or is_message(events[-1]) or events[-1].barrier:
        return None
    joined = [r for r in heard if r.source and r.source[0] == events[-1].tool]
    if not joined:
        return None
    allshapes: list[TokenShape] = [r.shapes[r.heard[0]] for r in heard]
    for r in heard:
        allshapes.extend(x for x in r.rivals if x not in allshapes)
    fired = [(r, t) for r in joined if (t := _joined_token(r, events, allshapes)) is not None]
    if len(fired) != 1:
        return None
    route, token = fired[0]
    step = route.steps[0]
    call = concrete(step.tool, route.heard[0], step.literals, token)
    made = {c.invocation() for c in events if c is not None and not is_message(c)}
    return None if call in made else (route, call)
