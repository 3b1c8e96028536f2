"""Listing and on-demand runs: the waggles a space sees with their figures (`list_waggles`), `run_waggle`, and
the tokens saved per day.

Split out of waggle.service (which re-exports the public names), one module per verb."""
from __future__ import annotations

from datetime import date, datetime, timedelta
from typing import Callable

from django.db.models import Count, Q, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from waggle.config import default_config
from waggle.models import LedgerEntry, Waggle
from waggle.replay import run_route
from waggle.route import Route, RouteFormatError, steps_summary
from waggle.trace import decode_value, flatten_value
from waggle.common import ExecFn, WaggleError, log
from waggle import following, recording


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
        recording._check_key("space_key", space_key)
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
        following._ledger(route, space_key, "", len(steps), outcome.yield_tokens if outcome.ok else 0, not outcome.ok,
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
