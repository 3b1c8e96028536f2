"""Sweeping and promotion: a space's recorded calls are mined for repeated routes; the best candidate that passes
the judge becomes a waggle (`sweep`, `promotable`), inbound routes too.

Split out of waggle.service (which re-exports the public names), one module per verb."""
from __future__ import annotations

import os
import time
from itertools import takewhile
from typing import Any

from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone

from waggle.config import WaggleConfig, default_config
from waggle import evidence
from waggle.miner import Candidate, mine, segments_to_trace
from waggle.inbound import HeardMemo, is_message, message_tokens, mine_heard, route_of
from waggle.models import ForageCall, Waggle
from waggle.route import Route, TraceIndex, choose_trigger, render_script, wilson_lower, wilson_upper
from waggle.told import words_of
from waggle.window import window as space_window
from waggle.trace import Call
from waggle.common import log


def _space_segments(space_key: str, cfg: WaggleConfig, *, messages: bool = False, episodes: list | None = None,
                    held=None, keys: list | None = None, words: dict | None = None,
                    wakes: list | None = None) -> list[list[Call | None]]:
    """The space's newest calls, one segment per session in call order. A call a replay made is
    never mining input: it stands as a barrier (no route spans the place where the model relied
    on a replay). Inbound messages are left out, unless ``messages`` (inbound routes are mined
    from messages and calls together). ``episodes``, when given, receives per segment the episode
    of each call: a fingerprint of the inbound message that started it (what the wake brought).
    ``keys``, when given, receives per segment (with ``messages``) a key that changes whenever the
    segment does: its session, first and last seq and length (rows are never changed, only added
    or trimmed). ``words``, when given, receives each episode's message words (see waggle.told);
    ``wakes``, per segment, each call's wake: the place of the message that started it."""
    held = held or space_window(space_key, cfg.mine_window)  # (held between sweeps: only new rows read)
    by_session = _by_session(held)
    segments = []
    for session, items in by_session.items():
        if messages:
            segments.append([c for _, c in items])
            if keys is not None:
                keys.append((session, items[0][0], items[-1][0], len(items)))
            continue
        seg, marks, episode, wake, woke, said = [], [], "", (session, 0), [], None
        for seq, c in items:
            if is_message(c):
                episode = c.out_hash or hash(c.refs)  # (rows read back keep their refs: the message's words)
                wake = (session, seq)
                # the agent acts on every message received since its last call: their words together
                said = (said or ()) + words_of(message_tokens(c))
                if words is not None and episode not in words:
                    words[episode] = said
                continue
            said = None
            seg.append(c)
            marks.append(episode)
            woke.append(wake)
        if seg:
            segments.append(seg)
            if episodes is not None:
                episodes.append(marks)
            if wakes is not None:
                wakes.append(woke)
    return segments


def _by_session(held) -> dict[str, list[tuple[int, Call | None]]]:
    """The window's rows by session (sessions sorted, each in seq order), grouped once per state of
    the window: a sweep's two miners (calls, messages and calls) read the same grouping."""
    state = (held.anchor, len(held.rows), next(iter(held.rows), None))
    got = held.grouped
    if got is not None and got[0] == state:
        return got[1]
    by_session: dict[str, list[tuple[int, Call | None]]] = {}
    for session, seq, call, _ in held.rows.values():
        by_session.setdefault(session, []).append((seq, call))
    out = {session: sorted(by_session[session], key=lambda t: t[0]) for session in sorted(by_session)}
    held.grouped = (state, out)
    return out


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
    words: dict = {}
    woke: list = []
    segments = _space_segments(space_key, cfg, episodes=marks, held=held, words=words, wakes=woke)
    trace = segments_to_trace(segments)
    sessions = [n for n, seg in enumerate(segments) for _ in range(len(seg) + (n > 0))]
    episodes = [e for n, seg in enumerate(marks) for e in ([""] if n > 0 else []) + seg]
    wakes = [e for n, seg in enumerate(woke) for e in ([None] if n > 0 else []) + seg]
    candidates = mine(trace, cfg.mine_config)
    created = None
    if candidates:
        own = {name: (count, disabled) for name, count, disabled in Waggle.objects.filter(
            scope=Waggle.SCOPE_SPACE, space_key=space_key).values_list("name", "mined_count", "disabled")}
        known = set(own) | set(Waggle.objects.filter(scope=Waggle.SCOPE_GLOBAL).values_list("name", flat=True))
        index = TraceIndex(trace, sessions, episodes, words, wakes)
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
    held = held or space_window(space_key, cfg.mine_window)
    keys: list = []
    segments = _space_segments(space_key, cfg, messages=True, held=held, keys=keys)
    if held.heard is None:
        held.heard = HeardMemo()  # (kept with the window: a sweep reads only the sessions that changed)
    heard = mine_heard(segments, min_contexts=cfg.min_contexts, min_confidence=cfg.min_confidence,
                       z=cfg.confidence_z, wilson=wilson_lower, keys=keys, memo=held.heard)
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
