"""The learning app's public API for the host. Nothing here imports the host.

Reads (cheap, never wait on a pass):
    prompt_block(domains) -> str | None

People's writes (the only write paths for user rules; every change records history):
    add_user_rule(domain, text, *, actor) -> Rule
    edit_user_rule(rule_id, text, *, actor, domain=None) -> Rule
    remove_user_rule(rule_id, *, actor) -> None
    set_learned_enabled(rule_id, enabled, *, actor) -> RuleChange | None
    approve_proposal(proposal_id, *, actor, edited_ops=None) -> RuleChange
    reject_proposal(proposal_id, *, actor, reason="") -> Proposal
    revert_change(history_id, *, actor) -> RuleChange

Passes (take the store's writer lock; return the PassRun with status, stats and errors):
    run_reflect(source=None, complete=None, progress=None) -> PassRun
    run_learn(domain=None, complete=None, auto_approve=False, progress=None) -> PassRun
    run_distill(source=None, complete=None, progress=None) -> PassRun

`actor` is a user object (its username is recorded) or a string.
"""
from __future__ import annotations

from .lock import LeaseLost, LockBusy, WriterLock
from .models import MAX_ACTIVE_RULES_PER_DOMAIN
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
from .store import RuleInputError, clear_cache, prompt_block

__all__ = [
    "MAX_ACTIVE_RULES_PER_DOMAIN",
    "Correction", "EmptySource", "OutboxItem", "SessionItem", "Source", "StaticSource",
    "GateError", "LeaseLost", "LockBusy", "OpError", "ReviewError", "RuleInputError", "WriterLock",
    "add_user_rule", "approve_proposal", "clear_cache", "edit_user_rule", "get_complete", "get_source",
    "prompt_block", "reject_proposal", "remove_user_rule", "revert_change", "run_distill", "run_learn",
    "run_reflect", "set_learned_enabled",
]
