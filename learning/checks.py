"""Start-up checks (registered in LearningConfig.ready)."""
from __future__ import annotations

import logging

from django.core.checks import Warning
from django.db import DatabaseError

log = logging.getLogger("learning.checks")


def check_rule_domains(app_configs=None, **kwargs):
    from . import store
    from .models import MAX_ACTIVE_RULES_PER_DOMAIN
    from .sources import get_source

    if app_configs is not None and not any(c.label == "learning" for c in app_configs):
        return []
    try:
        active = store.domains_with_active_rules()
        counts = store.active_learned_counts()
    except DatabaseError:  # not migrated yet, or no database: nothing to check
        return []
    problems = []
    try:
        routed = {str(d).strip().lower() for d in get_source().routed_domains()}
    except Exception as exc:  # the host's tables may not exist yet either
        log.debug("learning: routed_domains() failed: %s", exc)
        routed = None
    if routed is not None:
        for domain in sorted(active - routed):
            problems.append(Warning(
                f"Rule domain {domain!r} holds active rules but is routed to no member, so no run reads them.",
                hint="Add the domain to a member's rule domains, or fix a misspelt domain name.",
                obj=f"learning domain {domain}",
                id="learning.W001",
            ))
    for domain, n in sorted(counts.items()):
        if n > MAX_ACTIVE_RULES_PER_DOMAIN:
            problems.append(Warning(
                f"Rule domain {domain!r} holds {n} active learned rules (limit {MAX_ACTIVE_RULES_PER_DOMAIN}); "
                "every run that routes it pays for all of them, and adherence drops past the limit.",
                hint="Disable or consolidate learned rules in the admin; the learn gate will not add more.",
                obj=f"learning domain {domain}",
                id="learning.W002",
            ))
    return problems
