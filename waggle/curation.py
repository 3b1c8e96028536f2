"""Curation: the periodic pass that collects garbage, demotes failing waggles, prunes stale ones, promotes to
global and trims old rows (`curate`).

Split out of waggle.service (which re-exports the public names), one module per verb."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from waggle.config import DEFAULT_MIN_FAILS, DEFAULT_STALE_AGE, default_config
from waggle.models import FiredPlan, ForageCall, LedgerEntry, Waggle
from waggle.route import Route, RouteFormatError, render_script, wilson_upper
from waggle.common import log
from waggle import listing


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
    stats = listing._stats()
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
    stats = listing._stats()
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
