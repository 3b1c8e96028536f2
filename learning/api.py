"""The learning app's public API for the host. Nothing here imports the host.

Domains are owned. `owner` is an opaque key the host gives its tenants (Veronica: "space:<id>"); a
reference is a bare name (that owner's own domain) or global:<name> (a global domain staff made in
the admin). No call resolves a reference into another owner's domain. Owner "" is the unowned
namespace (learning used alone; in a host, rules nobody routes).

Domains:
    domain_for(ref, owner, create=True) -> Domain | None   own domain (made on first use) or global
    resolve(owner, refs) -> list[Domain]                    existing ones only

Reads (cheap, never wait on a pass):
    prompt_block(refs, owner) -> str | None

People's writes (the only write paths for user rules; every change records history). `scope`: the
domains the caller may touch (a host passes its tenant's); an id outside it is "not found":
    add_user_rule(domain, text, *, actor, owner="") -> Rule
    edit_user_rule(rule_id, text, *, actor, domain=None, owner="", scope=None) -> Rule
    remove_user_rule(rule_id, *, actor, scope=None) -> None
    set_learned_enabled(rule_id, enabled, *, actor, scope=None, reason="") -> RuleChange | None
    approve_proposal(proposal_id, *, actor, edited_ops=None, scope=None) -> RuleChange
    reject_proposal(proposal_id, *, actor, reason="", scope=None) -> Proposal
    revert_change(history_id, *, actor, scope=None) -> RuleChange

Passes (take the store's writer lock; return the PassRun with status, stats and errors):
    run_reflect(source=None, complete=None, progress=None) -> PassRun
    run_learn(domain=None, complete=None, auto_approve=False, progress=None) -> PassRun
    run_distill(source=None, complete=None, progress=None) -> PassRun

`actor` is a user object (its username is recorded) or a string.
"""
from __future__ import annotations

from .lock import LeaseLost, LockBusy, WriterLock
from .models import GLOBAL_PREFIX, MAX_ACTIVE_RULES_PER_DOMAIN, Domain
from .ops import GateError, OpError
from .passes import run_distill, run_learn, run_reflect
from .people import (
    ReviewError,
    add_user_rule,
    approve_proposal,
    edit_user_rule,
    reject_proposal,
    remove_user_rule,
    revert_change,
    set_learned_enabled,
)
from .sources import Correction, EmptySource, OutboxItem, SessionItem, Source, StaticSource, get_complete, get_source
from .store import RuleInputError, clean_ref, clear_cache, domain_for, prompt_block, resolve

__all__ = [
    "GLOBAL_PREFIX", "MAX_ACTIVE_RULES_PER_DOMAIN", "Domain", "clean_ref", "domain_for", "resolve",
    "Correction", "EmptySource", "OutboxItem", "SessionItem", "Source", "StaticSource",
    "GateError", "LeaseLost", "LockBusy", "OpError", "ReviewError", "RuleInputError", "WriterLock",
    "add_user_rule", "approve_proposal", "clear_cache", "edit_user_rule", "get_complete", "get_source",
    "prompt_block", "reject_proposal", "remove_user_rule", "revert_change", "run_distill", "run_learn",
    "run_reflect", "set_learned_enabled",
]
