"""Audit coverage (issue 27 point 2's closing figure): every verb that exists, found by looking (a
public function of veronica that takes who is acting), is audited, or is listed here as not a verb
of its own with the reason. Prints verbs audited / verbs that exist, and how many are exercised
through a door by tests/console/test_audit.py."""
from __future__ import annotations

import importlib
import inspect
import pkgutil

import veronica

# verbs that name the person another way than `actor` (user=, created_by=) or no way at all
OTHER_VERBS = [
    "veronica.engine.approvals.decide", "veronica.engine.approvals.allow_always", "veronica.engine.approvals.revoke_rule",
    "veronica.engine.approvals.answer", "veronica.engine.alarms.set_alarm", "veronica.swarm.chat.send_to", "veronica.swarm.bus.send",
    "veronica.swarm.bus.accept_operator_mail", "veronica.swarm.ledger.create_task", "veronica.swarm.access.create_token",
    "veronica.swarm.access.revoke_token", "veronica.portable.archive.export_archive", "veronica.engine.retention.purge_space",
]
# learning's rule verbs (learning never imports veronica): the console's rules door records them
DOOR_RECORDED = {
    "learning.api.add_user_rule": "rule.add", "learning.api.edit_user_rule": "rule.edit",
    "learning.api.remove_user_rule": "rule.remove", "learning.api.set_learned_enabled": "rule.enable/disable",
    "learning.api.approve_proposal": "proposal.approve", "learning.api.reject_proposal": "proposal.reject",
    "django.contrib.auth.login": "login", "django.contrib.auth.authenticate (failed)": "login.failed",
    "django.contrib.auth.logout": "logout",
    "django.contrib.auth.views.PasswordChangeView": "password.change",
    "django.contrib.admin (users, groups, learning's admin, ...)": "admin.<add|change|delete>.<app>.<model>",
}
# functions that take an actor but are a step inside a verb, or a door's parsing helper: the verb
# they serve is the audited one (one change, one row)
NOT_VERBS = {
    "veronica.swarm.ledger.transition": "the ledger's state step inside assign/cancel/retry/complete",
    "veronica.swarm.ledger.dispatch": "the mail-and-start step inside assign and the engine's dispatch",
    "veronica.agent.compaction.compact_session": "the work inside supervisor.compact",
    "veronica.portable.manifest.register": "a wrapper returning register_space(...).space",
    "veronica.api.cockpit.create_task": "the API's parsing before ledger.create_task",
    "veronica.api.cockpit.task_action": "the API's parsing before ledger.assign/reassign/cancel/retry",
    "veronica.api.cockpit.add_member": "the API's parsing before supervisor.add_member",
    "veronica.api.cockpit.add_skill": "the API's parsing before skills.add_skill",
    "veronica.web.views_a2a.console_action": "the console form's parsing before the a2a_settings verbs",
    "veronica.web.views_a2a.create_console_credential": "the console form's parsing before a2a_settings.create_credential",
}
# exercised elsewhere in tests/console/test_audit.py than its table
DOOR_TESTED_ELSEWHERE = {"veronica.swarm.blackboard.set_cap", "veronica.portable.archive.create_from_archive", "veronica.portable.manifest.register_space",
                         *DOOR_RECORDED}


# audited, but no person's door calls them alone: they run inside a door-tested verb (one row, the
# outer verb's), or only agents and the engine call them (no person: no row)
NO_DOOR_OF_THEIR_OWN = {
    "veronica.engine.budget.reopen": "inside set_member_budget / reset_day",
    "veronica.engine.budget.reopen_allowed": "inside set_space_limits",
    "veronica.engine.failures.unpark": "inside resume",
    "veronica.swarm.mcp_servers.replace_from_manifest": "inside register_space",
    "veronica.portable.archive.create_from_folder": "inside create_from_template / create_from_archive",
    "veronica.engine.roster.retire": "the leader's tool and the tick only",
    "veronica.swarm.ledger.complete": "the agents' tool only",
    "veronica.swarm.memory.append_note": "learning's distill pass only",
    "veronica.swarm.a2a_settings.apply_manifest": "inside register_space",
}


def discovered_verbs() -> dict[str, object]:
    found = {}
    for info in pkgutil.walk_packages(veronica.__path__, "veronica."):
        if ".migrations" in info.name or ".management.commands" in info.name or info.name == "veronica.swarm.audit":
            continue
        module = importlib.import_module(info.name)
        for name, fn in vars(module).items():
            fn = inspect.unwrap(fn) if callable(fn) else fn
            if (inspect.isfunction(fn) and fn.__module__ == info.name and not name.startswith("_")
                    and "actor" in inspect.signature(fn).parameters):
                found[f"{info.name}.{name}"] = getattr(module, name)
    for path in OTHER_VERBS:
        module, _, name = path.rpartition(".")
        found[path] = getattr(importlib.import_module(module), name)
    return found


def test_every_verb_is_audited_and_the_coverage_is_printed():
    from tests.console.test_audit import CASES

    verbs = discovered_verbs()
    unknown = sorted(set(NOT_VERBS) - set(verbs))
    assert not unknown, f"NOT_VERBS lists what no longer exists: {unknown}"
    real = {path: fn for path, fn in verbs.items() if path not in NOT_VERBS}
    audited = {path for path, fn in real.items() if getattr(fn, "audit_action", None)} | set(DOOR_RECORDED)
    exist = set(real) | set(DOOR_RECORDED)
    missing = sorted(exist - audited)
    door_tested = {p for p in exist for c in CASES if p.endswith("." + c.verb)} | DOOR_TESTED_ELSEWHERE
    print(f"\naudit coverage: {len(audited)}/{len(exist)} verbs audited; {len(door_tested & audited)}/{len(exist)} "
          f"exercised through a door with their row checked; not verbs of their own: {len(NOT_VERBS)}")
    print("audited, no door of their own: " + "; ".join(f"{p} ({why})" for p, why in sorted(NO_DOOR_OF_THEIR_OWN.items())))
    assert not missing, f"verbs that write no audit row: {missing}"
    assert sorted(exist - door_tested) == sorted(NO_DOOR_OF_THEIR_OWN), "a verb with a door needs a case in test_audit.py"
