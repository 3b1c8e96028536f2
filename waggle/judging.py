"""Judging: whether a replayed plan's output was used (`judge_reply`, `end_run`, `settle`), and what a waggle
learns or loses from the verdict.

Split out of waggle.service (which re-exports the public names), one module per verb."""
from __future__ import annotations

import re
from collections import Counter

from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from waggle.config import WaggleConfig, default_config
from waggle import evidence
from waggle.models import FiredPlan, LedgerEntry, Waggle
from waggle.recorder import Recorder
from waggle.route import Route, mined_prior, wilson_upper
from waggle.trace import Call, flatten_args
from waggle.common import log
from waggle import recording, speech, sweeping


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
    settings: the replayed output was not what it needed), ``"swapped"`` (it made the call with the
    same values in other arguments, ``distance(a=y, b=x)`` after a replayed ``distance(a=x, b=y)``:
    the same question asked again, or the other way round; a miss either way), or None (none of
    these: see :func:`judge_reply`)."""
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
        if differing and sorted(map(str, own.values())) == sorted(map(str, other.values())):
            return "swapped"
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


def _walked_past(tail: list, lists: list[list[str]]) -> bool:
    """A replayed list walk drawn on at one element was read up to it: each element before it in
    the walk (the list's previous element, replayed in the same block, the same tool and other
    arguments) that the reply did not name was walked past, not skipped, as an agent walking a
    list makes every element on the way to the one it reports (a reply names what it found, not
    each element it passed). Marks them used; True when one changed. The elements after the last
    one drawn on stay undecided (the walk may have stopped there)."""
    changed = False
    for k in range(len(tail) - 1, 0, -1):
        if _verdict(tail[k]) != "used":
            continue
        j = k
        while j > 0 and _previous_element(tail[j - 1], tail[j], lists):
            j -= 1
            if _verdict(tail[j]) is None:
                tail[j].extend([None] * (8 - len(tail[j])))
                tail[j][7], changed = "used", True
    return changed


def _previous_element(a: list, b: list, lists: list[list[str]]) -> bool:
    """``a`` is the call on the element just before ``b``'s in one list the session's outputs held
    (the same tool, every other argument equal)."""
    if a[0] != b[0]:
        return False
    one, two = dict(a[1] or {}), dict(b[1] or {})
    if one.keys() != two.keys():
        return False
    diff = [k for k in one if one[k] != two[k]]
    if len(diff) != 1:
        return False
    x, y = one[diff[0]], two[diff[0]]
    return any(x in vals and y in vals and vals.index(y) == vals.index(x) + 1 for vals in lists)


def _silent(step: list) -> bool:
    """Undecided, and its output had something a reply could have named."""
    return _verdict(step) is None and len(step) > 6 and bool(step[6])


def _verdict(step: list) -> str | None:
    return step[7] if len(step) > 7 else None


HEARD, WROTE = 9, 10  # a step's marks after where the replay stood (index 8): a reply came since, one with text


def _lacks(tail: list, mark: int) -> bool:
    """The replay's steps carry every mark before ``mark`` and not ``mark`` itself (marks are
    appended in order: :func:`_mark`)."""
    return all(len(step) == mark for step in tail)


def _mark(tail: list, mark: int) -> bool:
    """Set ``mark`` on the replay's steps, once its earlier marks are set; True when the mark is new."""
    if not _lacks(tail, mark):
        return False
    for step in tail:
        step.append(True)
    return True


def _unheard(tail: list) -> bool:
    """No reply of the model (text or a call) came after the replay: its steps carry where the
    replay stood (index 8) and no mark that a reply was heard since (``HEARD``, set by
    :func:`judge_reply`). A row written before replays kept their position counts as heard."""
    return _lacks(tail, HEARD)


def _unwritten(tail: list) -> bool:
    """Replies came after the replay, but none with text: its steps carry the ``HEARD`` mark and
    not the ``WROTE`` one."""
    return _lacks(tail, WROTE)


def _untestable(tail: list) -> bool:
    """The model replied to the replay only with calls, none of which decided any of its steps,
    and each of them had something a text could have named: what a read brought for the model's
    reader (a distance it was asked for, a balance) is drawn on only in text, so calls that did
    not draw on it do not tell whether the model relied on it (see :func:`end_run`)."""
    return _unwritten(tail) and all(_silent(step) for step in tail)


def _pending(space_key: str, session_key: str) -> list[FiredPlan]:
    pin = recording._pins.get((space_key, session_key))
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
    brought (an id, a value, a name: see :mod:`waggle.evidence`); the elements of a replayed list
    walk before the one it drew on were walked past on the way (:func:`_walked_past`). It is a *miss* when the model
    issues that call itself, or asks the same tool about the same object with other settings (a
    replayed ``git_log(path=p, limit=5)`` followed by its own ``git_log(path=p, limit=50)``). A
    step the reply does neither for keeps waiting for later replies; the run's end books it unused
    (:func:`end_run`). A replay is settled once each of its steps is decided. Returns how many
    replays were settled. Never raises."""
    try:
        pending = _pending(space_key, session_key)
        if not pending and not speech.watching(space_key, session_key):
            speech.replied(space_key, session_key, recording._held_seq(space_key, session_key))
            return 0
        cfg = (config or default_config()).normalized()
        issued = [(str(t), flatten_args(a if isinstance(a, dict) else {})) for t, a in (calls or [])]
        said = evidence.reply_text(text if isinstance(text, str) else "", calls or [])
        if not pending:  # a replay fired earlier in this run: the model's reads still tell how much it names
            speech.watch(space_key, session_key, recording._ring(space_key, session_key, cfg), None, set(), said)
            return 0
        ring = recording._ring(space_key, session_key, cfg)
        tails = [[list(step) for step in fired.tail] for fired in pending]
        # each replay's calls (args kept as JSON texts), built once: the witnesses' filter and each replay's
        made = [{(str(s[0]), tuple(sorted((s[1] or {}).items()))) for s in tail} for tail in tails]
        every = set().union(*made)
        first = min((int(s[8]) for tail in tails for s in tail if len(s) > 8 and s[8] is not None), default=None)
        if first is not None:  # the model's own reads since the replay: how often it names what it read
            speech.watch(space_key, session_key, ring, first, every, said)
        settled = 0
        lists, done = None, set()
        spoke = bool(calls) or bool(text.strip() if isinstance(text, str) else "")
        wrote = bool(text.strip()) if isinstance(text, str) else False
        for fired, tail, replayed in zip(pending, tails, made):
            changed, since = spoke and _mark(tail, HEARD), None
            changed = (wrote and _mark(tail, WROTE)) or changed
            drawn: dict[str, int] = {}
            inferred = 0
            undecided = [step for step in tail if _verdict(step) is None]
            named: list = []
            for step in tail:
                if _verdict(step) is not None:
                    continue
                verdict = _judge_step(step, issued)
                if verdict is None and any(t == step[0] for t, _ in issued):
                    if lists is None:
                        lists, done = _lists(ring), {c.invocation() for c in ring.recent()}
                    verdict = "used" if _continued(step, issued, lists, done) else None
                    inferred += verdict == "used"
                if verdict is None and len(step) > 8 and step[6]:
                    if since is None:
                        since = speech.learned_since(ring, int(step[8]), replayed)
                    verdict = "used" if evidence.drawn(step[6], said, since) else None
                    if verdict:
                        drawn[str(step[0])] = drawn.get(str(step[0]), 0) + 1
                        named.append(step)
                if verdict is not None:
                    step.extend([None] * (8 - len(step)))  # (a row written before verdicts were kept)
                    step[7], changed = verdict, True
            if len(tail) > 1 and any(_verdict(step) == "used" for step in tail[1:]):
                if lists is None:
                    lists, done = _lists(ring), {c.invocation() for c in ring.recent()}
                before = sum(_verdict(step) == "used" for step in tail)
                changed = _walked_past(tail, lists) or changed
                inferred += sum(_verdict(step) == "used" for step in tail) - before
            unnamed = [step for step in undecided if _verdict(step) == "used" and not any(step is n for n in named)]
            if drawn or inferred:
                # a step booked used unnamed that a later reply names was drawn on after all (as a
                # witness is: speech.watch), so it counts towards the route's drawn steps
                speech.booked(space_key, session_key, fired.name, drawn=drawn, inferred=inferred,
                              unnamed=[(str(step[0]), list(step[6]), int(step[8]), replayed) for step in unnamed
                                       if len(step) > 8 and step[6] and step[8] is not None])
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
    replayed step of the session no reply drew on is booked unused, and its replays settled,
    except as many silent steps (with something to show, earliest first) as the model's measured
    silence about its own reads accounts for (:mod:`waggle.speech`: none when no replayed step
    was drawn on). A replay after which the model said nothing at all (no text, no call: the run
    was cut off, or ended on an empty reply) is left *unjudged*: there was no reply that could have
    drawn on it, so booking it unused would count a prediction never put to the test as a miss
    (and demote a route for where runs happen to stop), and booking it used is the bug the
    ledger exists to avoid. So is a replay the model answered only with calls (it wrote no text
    after it, to the run's end) when those calls decided none of its steps and each of them had
    something to show (:func:`_untestable`): a call draws on what a later tool needs, the text on
    what the reader asked for (a distance, a balance), so calls alone that did not draw on it
    leave open whether the model relied on it. A replay with a step that had nothing to show
    (no reply could have shown it used), or one of whose steps the calls decided, is booked as
    ever. Its ledger row stays unsettled (out of the route's figures and its demotion), saying
    why. Returns how many replays were settled. Never raises."""
    try:
        pin = recording._pins.get((space_key, session_key))
        if pin is not None and not pin.maybe_pending:
            return 0  # nothing fired and nothing was found waiting under this pin: no query
        pending = _pending(space_key, session_key)
        cfg = (config or default_config()).normalized()
        tails = [[list(step) for step in fired.tail] for fired in pending]
        judged = []
        for fired, tail in zip(pending, tails):
            why = UNJUDGED if _unheard(tail) else UNWRITTEN if _untestable(tail) else None
            if why:
                _leave_unjudged(fired, tail, why)
            else:
                judged.append((fired, tail))
        pending, tails = [f for f, _ in judged], [t for _, t in judged]
        silent: dict[str, int] = {}
        for fired, tail in zip(pending, tails):
            silent[fired.name] = silent.get(fired.name, 0) + sum(1 for step in tail if _silent(step))
        quiet = speech.credit(space_key, session_key, silent)  # used in silence, by the model's measured speech
        for fired, tail in zip(pending, tails):
            for step in tail:
                if quiet.get(fired.name, 0) > 0 and _silent(step):
                    step.extend([None] * (8 - len(step)))
                    step[7] = "used"
                    quiet[fired.name] -= 1
        for fired, tail in zip(pending, tails):
            _close(space_key, session_key, fired, tail, cfg)
        if pin is not None:
            pin.none_pending, pin.maybe_pending = True, False
        return len(pending)  # (the unjudged ones are not settled)
    except Exception:  # noqa: BLE001 - best effort by contract
        log.exception("waggle: ending a run failed (space=%r session=%r); ignored", space_key, session_key)
        return 0


UNJUDGED = "unjudged: the run ended before the model replied to the replay"
UNWRITTEN = "unjudged: the model wrote no text after the replay, and its calls did not draw on it"


def _leave_unjudged(fired: FiredPlan, tail: list, why: str) -> None:
    """Close the replay without a verdict (see :func:`end_run`): its row no longer waits, its ledger
    entry stays unsettled, which keeps it out of every figure and demotion."""
    for step in tail:
        step.extend([None] * (8 - len(step)))
        step[7] = "unjudged"
    if FiredPlan.objects.filter(pk=fired.pk, settled=False).update(settled=True, tail=tail) and fired.ledger_id:
        LedgerEntry.objects.filter(pk=fired.ledger_id, settled=False).update(detail=why)


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
    data["reach"] = {str(m): r for m, r in sorted(sweeping._trimmed_reach(data, cfg).items())}
    Waggle.objects.filter(pk=w.pk).update(route=data)


def _demote_if_missing(scope: str, store_key: str, name: str, cfg: WaggleConfig) -> bool:
    """Disable the route when, over its settled replays and what vouched for it beyond the bar
    when it was mined (:func:`waggle.route.mined_prior`), the upper bound of "step used" is below
    ``min_confidence``: it has shown, beyond small-sample doubt, that it misses too often."""
    agg = LedgerEntry.objects.filter(scope=scope, store_key=store_key, name=name, settled=True,
                                     on_demand=False).aggregate(steps=Sum("steps"), used=Sum("used_steps"))
    steps, used = agg["steps"] or 0, agg["used"] or 0
    if steps == 0 or wilson_upper(used, steps, cfg.confidence_z) >= cfg.min_confidence:
        return False
    # what vouched for it when mined counts too: one early miss does not bury a route that many
    # contexts vouched for (the live misses must outweigh them)
    stored = Waggle.objects.filter(scope=scope, space_key=store_key, name=name).values_list("route", flat=True).first()
    prior_steps, prior_used = mined_prior(stored, cfg.min_contexts)
    if wilson_upper(used + prior_used, steps + prior_steps, cfg.confidence_z) >= cfg.min_confidence:
        return False
    changed = Waggle.objects.filter(scope=scope, space_key=store_key, name=name, disabled=False).update(
        disabled=True, touched=timezone.now())
    if changed:
        log.info("waggle: demoted %s (%d of %d replayed steps used)", name, used, steps)
        # A demoted route stops replaying in this process at once, and again at the commit: a pin of
        # another thread that reloaded its routes in between read the route still enabled.
        _forget_pinned_routes()
        transaction.on_commit(_forget_pinned_routes)
    return bool(changed)


def _forget_pinned_routes() -> None:
    for pin in list(recording._pins.values()):
        pin.routes = None
