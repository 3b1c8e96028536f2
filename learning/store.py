"""Rule reads and writes on the ORM: the prompt block (with its cross-process cache), snapshots,
applying ops, restoring a snapshot, history records.

Readers never lock and never open a transaction: the prompt block is one SELECT (a consistent
snapshot on both PostgreSQL and SQLite WAL), so a reader sees the rule set before or after a
change, never half of it, and never waits on a pass. Writers change rules in one transaction that
starts by stamping StoreState, which on PostgreSQL row-locks it and so serializes rule writers.
"""
from __future__ import annotations

import re
import secrets
from typing import Iterable

from django.db import IntegrityError, connection, transaction
from django.db.models import Count, Q

from . import ops as ops_mod
from .models import (
    DOMAIN_PATTERN,
    MAX_ACTIVE_RULES_PER_DOMAIN,
    MAX_RULE_CHARS,
    ChangeAction,
    Proposal,
    Rule,
    RuleChange,
    RuleSource,
    StoreState,
)
from .render import render_block

_DOMAIN = re.compile(DOMAIN_PATTERN)


class RuleInputError(ValueError):
    """Bad input from a person; names the field and the limit."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def clean_domain(domain: object) -> str:
    if not isinstance(domain, str):
        raise RuleInputError("domain", "must be a string")
    value = domain.strip().lower()
    if not _DOMAIN.match(value):
        raise RuleInputError(
            "domain", f"{domain!r} is not a domain name (lowercase letters, digits, . _ -; at most 64 characters)"
        )
    return value


def clean_rule_text(text: object) -> str:
    if not isinstance(text, str):
        raise RuleInputError("text", "must be a string")
    value = text.strip()
    if not value:
        raise RuleInputError("text", "is empty")
    if len(value) > MAX_RULE_CHARS:
        raise RuleInputError("text", f"is {len(value)} characters; the limit is {MAX_RULE_CHARS}")
    return value


def actor_name(actor: object) -> str:
    name = getattr(actor, "get_username", None)
    value = name() if callable(name) else (str(actor) if actor is not None else "")
    value = value.strip()
    if not value:
        raise RuleInputError("actor", "every rule change needs the name of who made it")
    return value[:150]


# --- the stamp (cache key) ------------------------------------------------------------------------

def bump_stamp() -> int:
    """Call inside the writer's transaction, first: row-locks the singleton on PostgreSQL."""
    stamp = secrets.randbits(62) + 1
    if not StoreState.objects.filter(pk=1).update(stamp=stamp):
        try:
            with transaction.atomic():
                StoreState.objects.create(pk=1, stamp=stamp)
        except IntegrityError:
            StoreState.objects.filter(pk=1).update(stamp=stamp)
    return stamp


def read_stamp() -> int | None:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT stamp FROM {StoreState._meta.db_table} WHERE id = 1")
        row = cursor.fetchone()
    return row[0] if row else None


# --- the prompt block -----------------------------------------------------------------------------

_cache: dict[tuple[str, ...], tuple[int, str | None]] = {}
_CACHE_MAX = 512


def clear_cache() -> None:
    _cache.clear()


def _build_block(domains: tuple[str, ...]) -> str | None:
    rows = list(
        Rule.objects.filter(domain__in=domains)
        .filter(Q(source=RuleSource.USER) | Q(source=RuleSource.LEARNED, enabled=True))
        .values_list("domain", "source", "text", "strength", "id")
    )
    order = {d: i for i, d in enumerate(domains)}
    user = sorted((r for r in rows if r[1] == RuleSource.USER), key=lambda r: (order[r[0]], r[4]))
    learned = sorted((r for r in rows if r[1] == RuleSource.LEARNED), key=lambda r: (order[r[0]], -r[3], r[4]))
    return render_block([(r[0], r[2]) for r in user], [(r[0], r[2]) for r in learned])


def prompt_block(domains: Iterable[str]) -> str | None:
    """The rules block for one run. Warm: one indexed single-row query (the stamp) and a dict
    lookup. Cold or after any change: one more query. Never takes a lock or a transaction."""
    key: list[str] = []
    for d in domains or ():
        if isinstance(d, str):
            d = d.strip().lower()
            if d and d not in key:
                key.append(d)
    if not key:
        return None
    dkey = tuple(key)
    stamp = read_stamp()  # read BEFORE the rules, so a cached block is never older than its stamp
    hit = _cache.get(dkey)
    if hit is not None and stamp is not None and hit[0] == stamp:
        return hit[1]
    block = _build_block(dkey)
    if stamp is not None:
        if len(_cache) >= _CACHE_MAX:
            _cache.clear()
        _cache[dkey] = (stamp, block)
    return block


# --- snapshots ------------------------------------------------------------------------------------

def snapshot(rules: Iterable[Rule], *, with_domain: bool = False) -> list[dict]:
    out = [{"id": r.pk, "text": r.text, "strength": r.strength, "enabled": r.enabled} for r in rules]
    if with_domain:
        for item, r in zip(out, rules):
            item["domain"] = r.domain
    return out


def learned_snapshot(domain: str) -> list[dict]:
    return snapshot(Rule.objects.filter(domain=domain, source=RuleSource.LEARNED).order_by("id"))


def user_snapshot(domain: str) -> list[dict]:
    return snapshot(Rule.objects.filter(domain=domain, source=RuleSource.USER).order_by("id"))


def active_learned_counts() -> dict[str, int]:
    rows = (
        Rule.objects.filter(source=RuleSource.LEARNED, enabled=True)
        .values("domain").annotate(n=Count("id")).values_list("domain", "n")
    )
    return dict(rows)


def domains_with_active_rules() -> set[str]:
    return set(
        Rule.objects.filter(Q(source=RuleSource.USER) | Q(source=RuleSource.LEARNED, enabled=True))
        .values_list("domain", flat=True).distinct()
    )


def all_domains() -> list[str]:
    return sorted(set(Rule.objects.values_list("domain", flat=True).distinct()))


# --- learned-rule writes (only from an approved proposal, a person's revert or toggle) -------------

def _record(domain, source, action, actor, before, after, *, proposal=None, reverts=None, summary="") -> RuleChange:
    diff = ops_mod.snapshot_diff(before, after, source=source)
    return RuleChange.objects.create(
        actor=actor, domain=domain, source=source, action=action, before=before, after=after, diff=diff,
        proposal=proposal, reverts=reverts, summary=summary[:300],
    )


def _write_learned(domain: str, current: list[dict], target: list[dict], actor: str) -> None:
    """Make the domain's learned rules equal `target` (ids None = new rows). Learned rows only:
    every query is filtered on source=learned and this domain, so no id can reach a user rule."""
    existing = {r.pk: r for r in Rule.objects.filter(domain=domain, source=RuleSource.LEARNED)}
    keep = set()
    for item in target:
        rid = item.get("id")
        if rid is None:
            Rule.objects.create(domain=domain, source=RuleSource.LEARNED, text=item["text"],
                                strength=item.get("strength", 1), enabled=item.get("enabled", True),
                                created_by=actor, updated_by=actor)
            continue
        keep.add(rid)
        row = existing.get(rid)
        if row is None:  # restoring a snapshot that held a rule since deleted: recreate it
            if Rule.objects.filter(pk=rid).exists():
                raise ops_mod.OpError(f"L{rid} exists outside this domain's learned rules")
            Rule.objects.create(pk=rid, domain=domain, source=RuleSource.LEARNED, text=item["text"],
                                strength=item.get("strength", 1), enabled=item.get("enabled", True),
                                created_by=actor, updated_by=actor)
            continue
        if (row.text, row.strength, row.enabled) != (item["text"], item.get("strength", 1), item.get("enabled", True)):
            row.text, row.strength, row.enabled = item["text"], item.get("strength", 1), item.get("enabled", True)
            row.updated_by = actor
            row.save(update_fields=["text", "strength", "enabled", "updated_by", "updated_at"])
    for rid, row in existing.items():
        if rid not in keep:
            row.delete()


def apply_ops(domain: str, ops: list[dict], *, actor: str, proposal: Proposal | None = None,
              max_active: int = MAX_ACTIVE_RULES_PER_DOMAIN) -> RuleChange:
    """Apply ops to the domain's current learned rules, all or nothing. Raises OpError / GateError."""
    with transaction.atomic():
        bump_stamp()
        before = learned_snapshot(domain)
        target = ops_mod.apply_ops(before, ops, max_active=max_active)
        _write_learned(domain, before, target, actor)
        after = learned_snapshot(domain)
        return _record(domain, RuleSource.LEARNED, ChangeAction.APPLY, actor, before, after, proposal=proposal,
                       summary=f"proposal #{proposal.pk}" if proposal else "ops")


def restore_learned(domain: str, expected: list[dict], target: list[dict], *, actor: str,
                    reverts: RuleChange) -> RuleChange:
    with transaction.atomic():
        bump_stamp()
        before = learned_snapshot(domain)
        if not ops_mod.same_rules(before, expected):
            raise ops_mod.OpError(
                f"the learned rules of {domain!r} changed after change #{reverts.pk}; revert the later changes first"
            )
        _write_learned(domain, before, target, actor)
        after = learned_snapshot(domain)
        return _record(domain, RuleSource.LEARNED, ChangeAction.REVERT, actor, before, after, reverts=reverts,
                       summary=f"revert of change #{reverts.pk}")


def set_learned_enabled(rule_id: int, enabled: bool, *, actor: str) -> RuleChange | None:
    with transaction.atomic():
        bump_stamp()
        rule = Rule.objects.get(pk=rule_id, source=RuleSource.LEARNED)
        if rule.enabled == bool(enabled):
            return None
        before = learned_snapshot(rule.domain)
        rule.enabled = bool(enabled)
        if rule.enabled and rule.strength == 0:
            rule.strength = 1
        rule.updated_by = actor
        rule.save(update_fields=["enabled", "strength", "updated_by", "updated_at"])
        after = learned_snapshot(rule.domain)
        return _record(rule.domain, RuleSource.LEARNED, ChangeAction.ENABLE if enabled else ChangeAction.DISABLE,
                       actor, before, after, summary=f"{'enabled' if enabled else 'disabled'} L{rule.pk}")
