"""Rule reads and writes on the ORM: the prompt block (with its cross-process cache), snapshots,
applying ops, restoring a snapshot, history records.

Readers never lock and never open a transaction: the prompt block is one SELECT (a consistent
snapshot on both PostgreSQL and SQLite WAL), so a reader sees the rule set before or after a
change, never half of it, and never waits on a pass. Writers change rules in one transaction that
starts by stamping StoreState, which on PostgreSQL row-locks it and so serializes rule writers.
"""
from __future__ import annotations

import re
from typing import Iterable

from django.db import IntegrityError, connection, transaction
from django.db.models import Count, Q

from . import ops as ops_mod
from .models import (
    DOMAIN_PATTERN,
    GLOBAL_PREFIX,
    MAX_OWNER_CHARS,
    Domain,
    MAX_ACTIVE_RULES_PER_DOMAIN,
    MAX_RULE_CHARS,
    ChangeAction,
    Proposal,
    Rule,
    RuleChange,
    RuleSource,
    StoreState,
    bump_stamp,  # moved to learning.models beside StoreState (Domain.save calls it); store's callers read it here
)
from .parsing import unstorable
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


def clean_ref(ref: object) -> tuple[bool, str]:
    """A routed domain reference: a bare name (the owner's own domain) or global:<name>."""
    if isinstance(ref, str) and ref.strip().lower().startswith(GLOBAL_PREFIX):
        return True, clean_domain(ref.strip()[len(GLOBAL_PREFIX):])
    return False, clean_domain(ref)


def clean_owner(owner: object) -> str:
    if not isinstance(owner, str) or len(owner) > MAX_OWNER_CHARS or "\x00" in owner:
        raise RuleInputError("owner", f"must be a string of at most {MAX_OWNER_CHARS} characters")
    return owner


def domain_for(ref: object, owner: str = "", *, create: bool = True, actor: str = "") -> Domain | None:
    """The domain a reference names for this owner: its own domain of that name (created on first
    use when `create`), or the global domain of that name. Never another owner's domain. Global
    domains are never created here: staff create them in the admin. None when it does not exist."""
    is_global, name = clean_ref(ref)
    owner = clean_owner(owner)
    if is_global:
        return Domain.objects.filter(is_global=True, name=name).first()
    found = Domain.objects.filter(owner=owner, is_global=False, name=name).first()
    if found is not None or not create:
        return found
    try:
        with transaction.atomic():
            return Domain.objects.create(owner=owner, name=name, created_by=actor[:150])
    except IntegrityError:  # created by someone else just now
        return Domain.objects.get(owner=owner, is_global=False, name=name)


def as_domain(domain: object, owner: str = "", *, actor: str = "") -> Domain:
    """A Domain from a Domain, or a reference resolved in `owner`'s namespace (see domain_for)."""
    if isinstance(domain, Domain):
        return domain
    found = domain_for(domain, owner, actor=actor)
    if found is None:
        raise RuleInputError("domain", f"no global domain {domain!r}; staff create global domains in the admin")
    return found


def resolve(owner: str, refs: Iterable[object]) -> list[Domain]:
    """The existing domains `refs` name for this owner (own first, by name; globals by global:name),
    in the order given. Bad references are skipped. Creates nothing."""
    plain, shared = _split_refs(refs)
    found = {}
    if plain:
        for d in Domain.objects.filter(owner=owner, is_global=False, name__in=plain):
            found[d.name] = d
    if shared:
        for d in Domain.objects.filter(is_global=True, name__in=shared):
            found[f"{GLOBAL_PREFIX}{d.name}"] = d
    return [found[r] for r in _refs_in_order(plain, shared) if r in found]


def _split_refs(refs: Iterable[object]) -> tuple[list[str], list[str]]:
    plain: list[str] = []
    shared: list[str] = []
    for ref in refs or ():
        try:
            is_global, name = clean_ref(ref)
        except RuleInputError:
            continue
        bucket = shared if is_global else plain
        if name not in bucket:
            bucket.append(name)
    return plain, shared


def _refs_in_order(plain: list[str], shared: list[str]) -> list[str]:
    return plain + [f"{GLOBAL_PREFIX}{n}" for n in shared]


def domain_id(domain: object) -> int | None:
    """A Domain's id from a Domain, an id, or a reference in the unowned namespace (learning used
    alone; a host always passes Domains or ids). None for a reference that names no domain."""
    if isinstance(domain, Domain):
        return domain.pk
    if isinstance(domain, int):
        return domain
    found = domain_for(domain, "", create=False)
    return found.pk if found is not None else None


def clean_rule_text(text: object) -> str:
    if not isinstance(text, str):
        raise RuleInputError("text", "must be a string")
    value = text.strip()
    if not value:
        raise RuleInputError("text", "is empty")
    if len(value) > MAX_RULE_CHARS:
        raise RuleInputError("text", f"is {len(value)} characters; the limit is {MAX_RULE_CHARS}")
    if unstorable(value):
        raise RuleInputError("text", unstorable(value))
    return value


def actor_name(actor: object) -> str:
    name = getattr(actor, "get_username", None)
    value = name() if callable(name) else (str(actor) if actor is not None else "")
    value = value.strip()
    if not value:
        raise RuleInputError("actor", "every rule change needs the name of who made it")
    return value[:150]


# --- the stamp (cache key) ------------------------------------------------------------------------

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


def _build_block(owner: str, plain: list[str], shared: list[str]) -> str | None:
    mine = Q(domain__owner=owner, domain__is_global=False, domain__name__in=plain)
    rows = list(
        Rule.objects.filter(mine | Q(domain__is_global=True, domain__name__in=shared))
        .filter(Q(source=RuleSource.USER) | Q(source=RuleSource.LEARNED, enabled=True))
        .values_list("domain__name", "domain__is_global", "source", "text", "strength", "id")
    )
    order = {r: i for i, r in enumerate(_refs_in_order(plain, shared))}
    rows = [(f"{GLOBAL_PREFIX}{r[0]}" if r[1] else r[0], *r[2:]) for r in rows]
    user = sorted((r for r in rows if r[1] == RuleSource.USER), key=lambda r: (order[r[0]], r[4]))
    learned = sorted((r for r in rows if r[1] == RuleSource.LEARNED), key=lambda r: (order[r[0]], -r[3], r[4]))
    return render_block([(r[0], r[2]) for r in user], [(r[0], r[2]) for r in learned])


def prompt_block(domains: Iterable[str], owner: str = "") -> str | None:
    """The rules block for one run: the owner's own domains that `domains` names, plus the global
    domains it names as global:<name>; no other owner's rules, whatever the names. Warm: one
    indexed single-row query (the stamp) and a dict lookup. Cold or after any change: one more
    query. Never takes a lock or a transaction."""
    plain, shared = _split_refs(domains)
    if not plain and not shared:
        return None
    dkey = (str(owner), *_refs_in_order(plain, shared))
    stamp = read_stamp()  # read BEFORE the rules, so a cached block is never older than its stamp
    hit = _cache.get(dkey)
    if hit is not None and stamp is not None and hit[0] == stamp:
        return hit[1]
    block = _build_block(str(owner), plain, shared)
    if stamp is not None:
        if len(_cache) >= _CACHE_MAX:
            _cache.clear()
        _cache[dkey] = (stamp, block)
    return block


# --- snapshots ------------------------------------------------------------------------------------

def snapshot(rules: Iterable[Rule], *, with_domain: bool = False) -> list[dict]:
    rules = list(rules)
    out = [{"id": r.pk, "text": r.text, "strength": r.strength, "enabled": r.enabled} for r in rules]
    if with_domain:  # user-rule history: where the rule lived (a move's revert goes back there)
        for item, r in zip(out, rules):
            item["domain_id"] = r.domain_id
            item["domain"] = r.domain.label
    return out


def learned_snapshot(domain) -> list[dict]:
    return snapshot(Rule.objects.filter(domain_id=domain_id(domain), source=RuleSource.LEARNED).order_by("id"))


def user_snapshot(domain) -> list[dict]:
    return snapshot(Rule.objects.filter(domain_id=domain_id(domain), source=RuleSource.USER).order_by("id"))


def active_learned_counts() -> dict[int, int]:
    """Domain id -> active learned rules."""
    rows = (
        Rule.objects.filter(source=RuleSource.LEARNED, enabled=True)
        .values("domain_id").annotate(n=Count("id")).values_list("domain_id", "n")
    )
    return dict(rows)


def domains_with_active_rules() -> set[int]:
    return set(
        Rule.objects.filter(Q(source=RuleSource.USER) | Q(source=RuleSource.LEARNED, enabled=True))
        .values_list("domain_id", flat=True).distinct()
    )


# --- learned-rule writes (only from an approved proposal, a person's revert or toggle) -------------

def _record(domain, source, action, actor, before, after, *, proposal=None, reverts=None, summary="") -> RuleChange:
    diff = ops_mod.snapshot_diff(before, after, source=source)
    return RuleChange.objects.create(
        actor=actor, domain_id=domain_id(domain), source=source, action=action, before=before, after=after, diff=diff,
        proposal=proposal, reverts=reverts, summary=summary[:300],
    )


def check_cap(domain, before: list[dict], target: list[dict], max_active: int = MAX_ACTIVE_RULES_PER_DOMAIN) -> None:
    """Every path that activates learned rules keeps the domain within the cap: a change that ends
    above it and has more active rules than before is refused (GateError names the limit)."""
    after = ops_mod.count_active(target)
    if after > max_active and after > ops_mod.count_active(before):
        label = getattr(domain, "label", domain)
        raise ops_mod.GateError(f"{label!r} would have {after} active learned rules; the limit is {max_active} "
                                "(disable or remove one first)")


def _write_learned(domain: Domain, current: list[dict], target: list[dict], actor: str,
                   max_active: int = MAX_ACTIVE_RULES_PER_DOMAIN) -> None:
    """Make the domain's learned rules equal `target` (ids None = new rows). Learned rows only:
    every query is filtered on source=learned and this domain, so no id can reach a user rule.
    Refuses to grow the domain past the active cap (check_cap)."""
    check_cap(domain, current, target, max_active)
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


def apply_ops(domain, ops: list[dict], *, actor: str, proposal: Proposal | None = None,
              max_active: int = MAX_ACTIVE_RULES_PER_DOMAIN, owner: str = "") -> RuleChange:
    """Apply ops to the domain's current learned rules, all or nothing. Raises OpError / GateError.
    `domain`: a Domain, or a reference resolved in `owner`'s namespace."""
    domain = as_domain(domain, owner, actor=actor)
    with transaction.atomic():
        bump_stamp()
        before = learned_snapshot(domain)
        target = ops_mod.apply_ops(before, ops, max_active=max_active)
        _write_learned(domain, before, target, actor, max_active)
        after = learned_snapshot(domain)
        return _record(domain, RuleSource.LEARNED, ChangeAction.APPLY, actor, before, after, proposal=proposal,
                       summary=f"proposal #{proposal.pk}" if proposal else "ops")


def restore_learned(domain: Domain, expected: list[dict], target: list[dict], *, actor: str,
                    reverts: RuleChange) -> RuleChange:
    with transaction.atomic():
        bump_stamp()
        before = learned_snapshot(domain)
        if not ops_mod.same_rules(before, expected):
            raise ops_mod.OpError(
                f"the learned rules of {domain.label!r} changed after change #{reverts.pk}; revert the later changes first"
            )
        _write_learned(domain, before, target, actor)
        after = learned_snapshot(domain)
        return _record(domain, RuleSource.LEARNED, ChangeAction.REVERT, actor, before, after, reverts=reverts,
                       summary=f"revert of change #{reverts.pk}")


def in_scope(queryset, scope):
    """Narrow a query of rules / proposals / changes to the domains a caller may touch (None: all)."""
    return queryset if scope is None else queryset.filter(domain_id__in=[domain_id(d) for d in scope])


def set_learned_enabled(rule_id: int, enabled: bool, *, actor: str, scope=None, reason: str = "") -> RuleChange | None:
    """A person's toggle; a disable's reason (why the rule was rejected) is kept in the change's summary."""
    with transaction.atomic():
        bump_stamp()
        rule = in_scope(Rule.objects, scope).get(pk=rule_id, source=RuleSource.LEARNED)
        if rule.enabled == bool(enabled):
            return None
        before = learned_snapshot(rule.domain_id)
        if enabled:
            check_cap(rule.domain, before, [dict(r, enabled=True) if r["id"] == rule.pk else r for r in before])
        rule.enabled = bool(enabled)
        if rule.enabled and rule.strength == 0:
            rule.strength = 1
        rule.updated_by = actor
        rule.save(update_fields=["enabled", "strength", "updated_by", "updated_at"])
        after = learned_snapshot(rule.domain_id)
        return _record(rule.domain_id, RuleSource.LEARNED, ChangeAction.ENABLE if enabled else ChangeAction.DISABLE,
                       actor, before, after, summary=f"{'enabled' if enabled else 'disabled'} L{rule.pk}"
                       + (f": {reason.strip()}" if reason.strip() else ""))
