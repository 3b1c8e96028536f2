"""Following: `follow` replays a matching waggle's remaining steps for a session, `inbound` hears a message that
matches an inbound route.

Split out of waggle.service (which re-exports the public names), one module per verb."""
from __future__ import annotations

from typing import Callable

from django.db import IntegrityError, transaction
from django.db.models import Q

from waggle.config import WaggleConfig, default_config
from waggle import evidence
from waggle.guard import write_guard
from waggle.inbound import is_message, message_call, message_tokens, plan_heard, plan_joined
from waggle.models import FiredPlan, ForageCall, LedgerEntry, Waggle
from waggle.replay import clamp_prefix, estimate_yield, find_plan, plan_key, run_steps
from waggle.route import Route, RouteFormatError
from waggle.told import words_of
from waggle.trace import Call, args_json, clean_text
from waggle.common import ExecFn, log
from waggle import judging, recording, routecache


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

        [waggle: replayed N steps]
        --- step 1/N: tool(arg="value")
        ...output...
        [waggle: end]

    ``reaches_out(tool)`` says which tools reach outside the space (the network, MCP servers not
    declared closed-world; None: none does): a value from a tool's output never becomes their
    argument without the model, so a route replays only up to such a step.

    Returns None when nothing fires. A concrete plan (route + parameter values) fires at most
    once per session, across processes (claimed in the database before it runs). An exec error
    or an empty output yields None and a failure ledger entry. Never raises.
    """
    try:
        cfg = (config or default_config()).normalized()
        recording._check_key("space_key", space_key)
        recording._check_key("session_key", session_key)
        pin = recording._pins.get((space_key, session_key))
        if pin is not None and pin.routes == []:
            return None  # nothing to replay in this space: no savepoint, no query
        with recording._contained():
            return _follow(space_key, session_key, exec, cfg, reaches_out)
    except Exception:  # noqa: BLE001 - best effort by contract
        log.exception("waggle: follow failed (space=%r session=%r); ignored", space_key, session_key)
        return None


def _message_words(events) -> tuple[str, ...]:
    """The words of the messages the agent is acting on: the session's latest one and those
    received right before it (no call between), in order; none without a message."""
    said: list = []
    for c in reversed(events):
        if is_message(c):
            said.append(c)
        elif said:
            break
    return words_of(t for c in reversed(said) for t in message_tokens(c))


def _session_routes(space_key: str, session_key: str):
    """The space's routes; a pinned session keeps the set it first saw, taken from this process's
    route cache (waggle.routecache: a change made elsewhere reaches new runs within seconds)."""
    pin = recording._pins.get((space_key, session_key))
    if pin is None:
        return _routes_for(space_key)
    if pin.routes is None:
        pin.routes = routecache.routes(space_key, _routes_for, keep=not _route_write_pending())
    return pin.routes


def _route_write_pending() -> bool:
    """This thread's open transaction wrote a route (its commit hook still waits): what it reads now
    may yet be rolled back, and no rollback tells the route cache, so it must not be kept there."""
    conn = transaction.get_connection()
    return conn.in_atomic_block and any(isinstance(func, routecache.AtCommit) and not func.ran
                                        for _, func, _ in conn.run_on_commit)


def ready(space_key: str, session_key: str, *, config: WaggleConfig | None = None) -> bool:
    """Call for a pinned session before the host transaction in which it would record the wake's
    message: read now, in autocommit, what :func:`inbound` needs (the session's ring, the space's
    routes), so inside the transaction it reads nothing and the message's row may ride in the host's
    last statement. Nothing to read for a session pinned as new whose space's routes are cached.

    Returns whether an inbound route of the space may fire on the message: then call :func:`inbound`
    outside the transaction (a replay runs a tool, maybe a remote one, and should not hold the host's
    locks meanwhile). True when unsure (unpinned, or on an error). Never raises."""
    try:
        if (space_key, session_key) not in recording._pins:
            return True  # unpinned: nothing is known ahead
        cfg = (config or default_config()).normalized()
        recording._check_key("space_key", space_key)
        recording._check_key("session_key", session_key)
        recording._ring(space_key, session_key, cfg)
        return any(r.heard for r in _session_routes(space_key, session_key))
    except Exception:  # noqa: BLE001 - best effort by contract
        log.exception("waggle: ready failed (space=%r session=%r); ignored", space_key, session_key)
        return True


def _follow(space_key: str, session_key: str, exec: ExecFn, cfg: WaggleConfig,
            reaches_out: Callable[[str], bool] | None = None) -> str | None:
    pin = recording._pins.get((space_key, session_key))
    routes = _session_routes(space_key, session_key)
    if not routes:
        return None
    ring = recording._ring(space_key, session_key, cfg)
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
    if plan is None:  # a joined inbound route whose join completes at this output (waggle.inbound)
        got = plan_joined(routes, ring.recent())
        return None if got is None else _fire_heard(space_key, session_key, None, got[0], got[1], exec, cfg)
    if not plan.route.told.allows(plan.binding, plan.tail, _message_words(ring.recent()),
                                  {v for c in recent[-plan.matched:] for _, v in c.refs}):
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
        known, at = judging._known(ring), ring.last_seq
        tail = [[tool, dict(args), estimate_yield([(tool, args)], [out]), judging._setting_keys(plan.route, plan.matched, tool),
                 plan.matched, pos, values, None, at]
                for (tool, args), out, pos, values in zip(plan.tail, outcome.outputs, plan.positions, evidence.block_evidence(
                    [(args_json(args), out) for args, out in zip((a for _, a in plan.tail), outcome.outputs)], known))]
        FiredPlan.objects.filter(pk=fired.pk).update(ledger_id=entry.pk, tail=tail)
        member = (ForageCall.objects.filter(space_key=space_key, session_key=session_key)
                  .order_by("-seq").values_list("member_key", flat=True).first()) or ""
        for (tool, args), out in zip(plan.tail, outcome.outputs):
            recording._record(space_key, session_key, member, Call.make(tool, args_json(args), output=out), cfg, replayed=True)
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
        recording._check_key("space_key", space_key)
        recording._check_key("session_key", session_key)
        with write_guard():
            recording._record(space_key, session_key, member_key, message_call(text if isinstance(text, str) else ""), cfg)
        if exec is None:
            return None
        pin = recording._pins.get((space_key, session_key))
        if pin is not None and pin.routes is not None and not any(r.heard for r in pin.routes):
            return None  # no inbound route in this space: no savepoint, no query
        with recording._contained():
            return _hear(space_key, session_key, member_key, exec, cfg)
    except Exception:  # noqa: BLE001 - best effort by contract
        log.exception("waggle: inbound failed (space=%r session=%r); ignored", space_key, session_key)
        return None


def _hear(space_key: str, session_key: str, member_key: str, exec: ExecFn, cfg: WaggleConfig) -> str | None:
    routes = _session_routes(space_key, session_key)
    heard = [r for r in routes if r.heard]
    if not heard:
        return None
    got = plan_heard(heard, recording._ring(space_key, session_key, cfg).recent())
    if got is None:
        return None
    return _fire_heard(space_key, session_key, member_key, got[0], got[1], exec, cfg)


def _fire_heard(space_key: str, session_key: str, member_key: str | None, route: Route, call: tuple,
                exec: ExecFn, cfg: WaggleConfig) -> str | None:
    """Replay an inbound route's one step (at a message, or at the output that completed its join)."""
    pin = recording._pins.get((space_key, session_key))
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
        ring = recording._ring(space_key, session_key, cfg)
        known, at = judging._known(ring), ring.last_seq
        rows = [[tool, dict(args), estimate_yield([(tool, args)], [out]), judging._setting_keys(route, 0, tool), -1, -1,
                 evidence.step_evidence(args_json(args), out, known), None, at]
                for (tool, args), out in zip(tail, outcome.outputs)]
        FiredPlan.objects.filter(pk=fired.pk).update(ledger_id=entry.pk, tail=rows)
        if member_key is None:
            member_key = (ForageCall.objects.filter(space_key=space_key, session_key=session_key)
                          .order_by("-seq").values_list("member_key", flat=True).first()) or ""
        for (tool, args), out in zip(tail, outcome.outputs):
            recording._record(space_key, session_key, member_key, Call.make(tool, args_json(args), output=out), cfg, replayed=True)
    return outcome.block
