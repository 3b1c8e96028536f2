"""Start-up checks (registered in LearningConfig.ready)."""
from __future__ import annotations

import logging

from django.core.checks import Warning
from django.db import DatabaseError

log = logging.getLogger("learning.checks")


def check_rule_domains(app_configs=None, **kwargs):
    from . import store
    from .models import MAX_ACTIVE_RULES_PER_DOMAIN, Domain
    from .sources import get_source

    if app_configs is not None and not any(c.label == "learning" for c in app_configs):
        return []
    try:
        active = store.domains_with_active_rules()
        counts = store.active_learned_counts()
    except DatabaseError:  # not migrated yet, or no database: nothing to check
        return []
    problems = []
    labels = {d.pk: d for d in Domain.objects.filter(pk__in=active | set(counts))}
    try:
        routed = _routed_keys(get_source().routed_domains())
    except Exception as exc:  # the host's tables may not exist yet either
        log.debug("learning: routed_domains() failed: %s", exc)
        routed = None
    if routed is not None:
        for d in sorted((labels[i] for i in active), key=lambda d: d.label):
            if _key(d) in routed:
                continue
            problems.append(Warning(
                f"Rule domain {d.label!r} holds active rules but is routed to no member, so no run reads them.",
                hint=("An unowned domain is read by no one: give it an owner or remove its rules in the admin."
                      if not d.owner and not d.is_global else
                      "Add the domain to a member's rule domains, or fix a misspelt domain name."),
                obj=f"learning domain {d.label}",
                id="learning.W001",
            ))
    for pk, n in sorted(counts.items(), key=lambda kv: labels[kv[0]].label):
        domain = labels[pk].label
        if n > MAX_ACTIVE_RULES_PER_DOMAIN:
            problems.append(Warning(
                f"Rule domain {domain!r} holds {n} active learned rules (limit {MAX_ACTIVE_RULES_PER_DOMAIN}); "
                "every run that routes it pays for all of them, and adherence drops past the limit.",
                hint="Disable or consolidate learned rules in the admin; the learn gate will not add more.",
                obj=f"learning domain {domain}",
                id="learning.W002",
            ))
    return problems


def _key(domain) -> tuple[str, str]:
    return ("", domain.ref) if domain.is_global else (domain.owner, domain.name)


def _routed_keys(routed) -> set[tuple[str, str]]:
    """Normalize (owner, ref) pairs; a global reference counts whoever routes it."""
    from .store import RuleInputError, clean_ref

    out = set()
    for item in routed:
        owner, ref = (item if isinstance(item, tuple) else ("", item))
        try:
            is_global, name = clean_ref(ref)
        except RuleInputError:
            continue
        out.add(("", f"global:{name}") if is_global else (str(owner), name))
    return out
