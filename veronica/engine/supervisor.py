"""Supervisor verbs: one function per operator / leader control. Admin, console, API and tests all call
these; each validates, writes with a conditional update and emits its event. The ones the leader's tools
call too (spawn, retire, remove_member, set_schedule, clear_schedule) live in veronica.engine.roster and
are re-exported here: this module checks tool sets against the agent's tool table, so the tools must not
import it."""
from __future__ import annotations

from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.utils import timezone

from veronica.swarm import audit, bus, events
from veronica.engine.cron import next_fire, validate_cron
from veronica.engine.timers import arm_cron
from veronica.engine.roster import (  # noqa: F401 (re-exported: the verbs the leader's tools call live there)
    HAS_LEASE, _refresh, clear_schedule, is_busy, remove_member, retire, set_schedule, spawn,
)
from veronica.engine.wakes import wake_on_commit
from veronica.plumbing.errors import Conflict, NotFound, VeronicaError, check_int, column_limit, require_text, text_problem
from veronica.models import (
    Member, Membership, Origin, PermissionMode, Phase, Role, RunStatus, Session, Space,
)

NAME_RE = r"^[A-Za-z][A-Za-z0-9_-]{0,59}$"
RESERVED_NAMES = {*bus.ENGINE_NAMES, Role.LEADER, Role.WORKER}  # role names address by role
MAX_PERSONA = 50000
MAX_WHEN_TO_USE = 2000
MAX_DOMAIN = 64  # learning's domain names
MAX_DOMAINS = 20
MAX_ITERATIONS = 200  # the manifest's limit too


def get_member(space: Space, name: str, among: QuerySet[Member] | None = None) -> Member:
    """among: the members to look in (Member.objects by default; a caller's annotations ride along)."""
    # a name that cannot be stored cannot exist; asking the database would be an error on PostgreSQL
    member = None if not isinstance(name, str) or text_problem(name) else (
        (Member.objects if among is None else among).filter(space=space, name=name, removed_at__isnull=True).first())
    if member is None:
        raise NotFound(f"no member named '{name}' in space {space.slug}", field="member")
    return member


# --- run control ----------------------------------------------------------------------------------

@audit.verb("member.suspend", watch="member")
def suspend(member: Member, *, actor: str) -> Member:
    """Park the member; a run in flight sees cancel_requested at its next step and stops."""
    with transaction.atomic():
        changed = Member.objects.filter(pk=member.pk, removed_at__isnull=True).exclude(run_status=RunStatus.SUSPENDED).update(
            run_status=RunStatus.SUSPENDED, cancel_requested=HAS_LEASE, phase_since=Now())  # its age: since suspended
        if changed:
            events.emit(member.space_id, "member.suspended", member=member, actor=actor)
    return _refresh(member)


@audit.verb("member.resume", watch="member")
def resume(member: Member, *, actor: str) -> Member:
    """Un-suspend, and un-park a member a permanent error (or a backoff) is holding: it runs now."""
    from veronica.engine import failures

    with transaction.atomic():
        changed = Member.objects.filter(pk=member.pk, run_status=RunStatus.SUSPENDED).update(
            run_status=RunStatus.IDLE, phase_since=Now())
        if changed:
            events.emit(member.space_id, "member.resumed", member=member, actor=actor)
        if (failures.unpark(member, actor=actor) or changed) and member.membership == Membership.ACTIVE:
            wake_on_commit([member.pk], "resume")
    return _refresh(member)


@audit.verb("space.halt_all", after=lambda a, n: {"suspended": n})
def halt_all(space: Space, *, actor: str) -> int:
    members = list(Member.objects.filter(space=space, removed_at__isnull=True).exclude(run_status=RunStatus.SUSPENDED))
    for member in members:
        suspend(member, actor=actor)
    return len(members)


@audit.verb("space.resume_all", after=lambda a, n: {"resumed": n})
def resume_all(space: Space, *, actor: str) -> int:
    """Undo halt-all: resume every suspended member (each with its own event and wake)."""
    members = list(Member.objects.filter(space=space, removed_at__isnull=True, run_status=RunStatus.SUSPENDED))
    for member in members:
        resume(member, actor=actor)
    return len(members)


@audit.verb("space.rename", watch="space")
def rename_space(space: Space, name: object, *, actor: str) -> Space:
    """The display name only: the slug (URLs, tokens' links, the data folder) stays."""
    name = require_text(name, "name", max_len=column_limit(Space, "name"))
    with transaction.atomic():
        before = Space.objects.select_for_update().filter(pk=space.pk).values_list("name", flat=True).get()
        if before != name:
            Space.objects.filter(pk=space.pk).update(name=name)
            events.emit(space.pk, "space.renamed", actor=actor, before=before, name=name)
    space.refresh_from_db()
    return space


@audit.verb("member.freeze", watch="member")
def freeze(member: Member, *, actor: str) -> Member:
    """Cold-store: never scheduled again until unfreeze. A run in flight is left to finish."""
    with transaction.atomic():
        frozen = Member.objects.filter(pk=member.pk, membership=Membership.ACTIVE, removed_at__isnull=True).update(
            membership=Membership.FROZEN, phase_since=Now())  # the roster's age counts from the freeze
        if frozen:
            events.emit(member.space_id, "member.frozen", member=member, actor=actor)
    return _refresh(member)


@audit.verb("member.unfreeze", watch="member")
def unfreeze(member: Member, *, actor: str) -> Member:
    with transaction.atomic():
        thawed = Member.objects.filter(pk=member.pk, membership=Membership.FROZEN, removed_at__isnull=True).update(
            membership=Membership.ACTIVE, phase_since=Now())
        if thawed:
            events.emit(member.space_id, "member.unfrozen", member=member, actor=actor)
            wake_on_commit([member.pk], "resume")
    return _refresh(member)


# --- membership ------------------------------------------------------------------------------------

def check_name(name: object) -> str:
    """The member name rules, without the database: the manifest checks folder names with it too."""
    import re

    limit = column_limit(Member, "name")
    name = require_text(name, "name", max_len=limit).strip()
    if name.lower() in RESERVED_NAMES:
        raise VeronicaError(f"name '{name}' is reserved: the engine sends mail or addresses members by it "
                            f"(reserved, in any case: {', '.join(sorted(RESERVED_NAMES))})", field="name")
    if not re.match(NAME_RE, name):
        raise VeronicaError(f"name '{name}' must start with a letter, use letters, digits, '-' or '_' (at most {limit}) "
                            f"and not be one of {', '.join(sorted(RESERVED_NAMES))}", field="name")
    return name


def _validate_name(space: Space, name: str) -> str:
    name = check_name(name)
    if Member.objects.filter(space=space, name=name, removed_at__isnull=True).exists():
        raise Conflict(f"a member named '{name}' already exists in this space", field="name")
    return name


def check_domains(rule_domains: object) -> list[str]:
    """A list of learning domain names; blanks are dropped, anything else not a short string is refused."""
    if rule_domains is None:
        return []
    if not isinstance(rule_domains, list) or len(rule_domains) > MAX_DOMAINS:
        raise VeronicaError(f"rule_domains must be a list of at most {MAX_DOMAINS} strings", field="rule_domains")
    domains = [require_text(d, "rule_domains", max_len=MAX_DOMAIN, allow_empty=True).strip() for d in rule_domains]
    from veronica.swarm.learning_bridge import clean_rule_domains  # names resolve in the member's own space only

    return clean_rule_domains([d for d in domains if d])


def check_tools(role: str, tools: object, deferred_tools: object) -> tuple[list[str] | None, list[str]]:
    """The tool set's names (None: every tool of the role); unknown or leader-only names are refused."""
    from veronica.agent.tools import check_tool_set  # engine → agent; the tools call roster, never this module

    return check_tool_set(role, tools, deferred_tools)


def validate_new_member(space: Space, name: str, *, role: str, model: str, permission_mode: str = "", schedule: str = "",
                        rule_domains: list[str] | None = None, persona: str = "", when_to_use: str = "",
                        budget_override: int | None = None) -> tuple[str, str, list[str]]:
    """Everything add_member checks before writing; the admin form runs it too."""
    from veronica.agent.providers import validate_model_spec

    require_text(persona, "persona", max_len=MAX_PERSONA, allow_empty=True)
    require_text(when_to_use, "when_to_use", max_len=MAX_WHEN_TO_USE, allow_empty=True)
    if budget_override is not None:
        check_int(budget_override, "budget_override")
    if role not in Role.values:
        raise VeronicaError(f"role must be one of {', '.join(Role.values)}", field="role")
    mode = permission_mode or space.default_permission_mode
    if mode not in PermissionMode.values:
        raise VeronicaError(f"permission_mode must be one of {', '.join(PermissionMode.values)}", field="permission_mode")
    validate_model_spec(model)
    _validate_name(space, name)
    if role == Role.LEADER and Member.objects.filter(space=space, role=Role.LEADER, removed_at__isnull=True).exists():
        raise Conflict("this space already has a leader; a space has at most one", field="role")
    cron = validate_cron(schedule) if schedule else ""
    return mode, cron, check_domains(rule_domains)


@audit.verb("member.add", created=True)
def add_member(space: Space, name: str, *, role: str = Role.WORKER, persona: str = "", when_to_use: str = "",
               model: str = "offline", permission_mode: str = "", schedule: str = "", rule_domains: list[str] | None = None,
               budget_override: int | None = None, actor: str = "operator", skills: dict[str, str] | None = None,
               origin: str = Origin.RUNTIME, max_iterations: int = 24, tools: list[str] | None = None,
               deferred_tools: list[str] | None = None, fallback: list[str] | None = None) -> Member:
    """Create a member (and its skills) in one transaction: a failure leaves nothing behind."""
    from veronica.agent.providers import validate_fallback

    name = name.strip() if isinstance(name, str) else name
    mode, cron, domains = validate_new_member(space, name, role=role, model=model, permission_mode=permission_mode,
                                              schedule=schedule, rule_domains=rule_domains, persona=persona,
                                              when_to_use=when_to_use, budget_override=budget_override)
    check_int(max_iterations, "max_iterations", minimum=1, maximum=MAX_ITERATIONS)
    tools, deferred_tools = check_tools(role, tools, deferred_tools)
    fallback = validate_fallback(fallback, model)
    when_to_use = when_to_use.strip()
    with transaction.atomic():
        try:
            member = Member.objects.create(
                space=space, name=name, role=role, persona=persona, when_to_use=when_to_use, model=model,
                permission_mode=mode, schedule=cron, schedule_origin=origin, origin=origin, rule_domains=domains,
                budget_override=budget_override, schedule_next_at=next_fire(cron) if cron else None, phase_since=timezone.now(),
                max_iterations=max_iterations, tools=tools, deferred_tools=deferred_tools, fallback=fallback)
        except IntegrityError as exc:
            raise Conflict(f"could not add member '{name}': {exc}", field="name") from None
        if cron:
            arm_cron(member.pk, member.schedule_next_at)
        for skill_name, body in (skills or {}).items():
            from veronica.swarm.skills import add_skill

            add_skill(space, skill_name, body, member=member, actor=actor)
        events.emit(space.pk, "member.added", member=member, actor=actor, role=role, model=model)
    return member


# --- session / schedule / mode / skills --------------------------------------------------------------

@audit.verb("member.clear_session")
def clear_session(member: Member, *, actor: str) -> None:
    """Wipe the conversation, keep the seat: membership, schedule, skills, memory and budget stay."""
    with transaction.atomic():
        locked = Member.objects.filter(pk=member.pk, lease_token="").exclude(run_status=RunStatus.BUSY).update(phase=Phase.READY)
        if not locked:
            raise Conflict(f"cannot clear '{member.name}' while it is running; suspend it or wait", field="member")
        Session.objects.filter(member=member, ended_at__isnull=True).update(ended_at=timezone.now(), end_reason="cleared")
        events.emit(member.space_id, "member.session_cleared", member=member, actor=actor)


@audit.verb("member.compact")
def compact(member: Member, kind: str, *, actor: str) -> dict:
    """Compaction claims the run slot like a wake, so it never races a run; a wake that arrives
    meanwhile coalesces and the mail is drained when the slot is released. Its call is metered."""
    from veronica.agent.compaction import compact_session
    from veronica.agent.runctx import LeaseLost
    from veronica.engine import slot
    from veronica.models import RunOutcome

    if kind not in ("micro", "full"):
        raise VeronicaError("kind must be 'micro' or 'full'", field="kind")
    lease = slot.claim(member, "compact", held_ok=True)
    if lease is None:
        raise Conflict(f"cannot compact '{member.name}' while it is running (or suspended, frozen or removed); "
                       "wait, or resume it first", field="member")
    try:
        result = compact_session(lease.member, kind, lease, actor=actor)
    except LeaseLost:
        raise Conflict(f"compaction of '{member.name}' lost its lease; nothing was changed", field="member") from None
    except Exception as exc:
        slot.finish(lease, RunOutcome.ABORTED, f"compaction failed: {type(exc).__name__}: {exc}", settle=False)
        raise
    slot.finish(lease, RunOutcome.DONE, settle=False)
    return result


@audit.verb("member.permission_mode", watch="member")
def set_permission_mode(member: Member, mode: str, *, actor: str) -> Member:
    if mode not in PermissionMode.values:
        raise VeronicaError(f"mode must be one of {', '.join(PermissionMode.values)}", field="mode")
    with transaction.atomic():
        Member.objects.filter(pk=member.pk).update(permission_mode=mode, permission_origin=Origin.RUNTIME)
        events.emit(member.space_id, "member.permission_mode", member=member, mode=mode, actor=actor)
    return _refresh(member)


MAX_ITERATIONS = 200  # the manifest's limit


def _check_role(member: Member, role: object) -> None:
    if role not in Role.values:
        raise VeronicaError(f"role must be one of {', '.join(Role.values)}", field="role")
    if role == Role.LEADER and Member.objects.filter(space_id=member.space_id, role=Role.LEADER, removed_at__isnull=True
                                                     ).exclude(pk=member.pk).exists():
        raise Conflict("this space already has a leader; a space has at most one", field="role")


# --- editing a member's configuration ----------------------------------------------------------------

# the fields edit_member writes itself; schedule and permission_mode go through their own verbs
CONFIG_FIELDS = ("role", "persona", "when_to_use", "model", "fallback", "budget_override", "max_iterations", "rule_domains", "tools",
                 "deferred_tools")
EDITABLE = (*CONFIG_FIELDS, "schedule", "permission_mode")


def _config_value(member: Member, field: str, value: object, changes: dict) -> object:
    """One field's value as stored, or a VeronicaError naming the field and its limit."""
    from veronica.agent.providers import validate_fallback, validate_model_spec

    if field == "role":
        _check_role(member, value)
        return value
    if field == "persona":
        return require_text(value, "persona", max_len=MAX_PERSONA, allow_empty=True).strip()
    if field == "when_to_use":
        return require_text(value, "when_to_use", max_len=MAX_WHEN_TO_USE, allow_empty=True).strip()
    if field == "model":
        return validate_model_spec(value)
    if field == "fallback":
        return validate_fallback(value, str(changes.get("model", member.model)))
    if field == "budget_override":
        return None if value is None else check_int(value, "budget_override")
    if field == "max_iterations":
        return check_int(value, "max_iterations", minimum=1, maximum=MAX_ITERATIONS)
    if field == "rule_domains":
        return check_domains(value)
    tools, deferred = check_tools(changes.get("role", member.role), changes.get("tools", member.tools),
                                  changes.get("deferred_tools", member.deferred_tools))
    return tools if field == "tools" else deferred


def clean_member_edit(member: Member, changes: dict) -> dict:
    """Every check edit_member makes, without writing (the admin form shows them as field errors):
    the values as they would be stored, or a VeronicaError naming the field and its limit."""
    unknown = sorted(set(changes) - set(EDITABLE))
    if unknown:
        raise VeronicaError(f"{unknown[0]} cannot be edited here; editable: {', '.join(EDITABLE)}", field=unknown[0])
    if member.removed_at is not None:
        raise NotFound(f"member '{member.name}' is removed", field="member")
    cleaned = {f: _config_value(member, f, changes[f], changes) for f in CONFIG_FIELDS if f in changes}
    cron = changes.get("schedule")
    if cron is not None:
        cleaned["schedule"] = validate_cron(require_text(cron, "schedule", max_len=120, allow_empty=True).strip()) \
            if str(cron).strip() else ""
    mode = changes.get("permission_mode")
    if mode is not None:
        if mode not in PermissionMode.values:
            raise VeronicaError(f"permission_mode must be one of {', '.join(PermissionMode.values)}", field="permission_mode")
        cleaned["permission_mode"] = mode
    return cleaned


@audit.verb("member.edit", watch="member")
def edit_member(member: Member, changes: dict, *, actor: str) -> Member:
    """Change a member's configuration (any of EDITABLE) in one transaction: everything is checked
    first, so a refused field changes nothing. The fields are marked runtime edits: a restart
    register keeps them, a fresh one puts the manifest's values back. The prompt and tools change
    at the member's next run."""
    cleaned = clean_member_edit(member, changes)
    cron, mode = cleaned.pop("schedule", None), cleaned.pop("permission_mode", None)
    values = cleaned
    changed = sorted(f for f, v in values.items() if getattr(member, f) != v)
    with transaction.atomic():
        if changed:
            marked = sorted(set(member.runtime_fields or []) | set(changed))
            try:
                Member.objects.filter(pk=member.pk).update(**{f: values[f] for f in changed}, runtime_fields=marked)
            except IntegrityError:  # a leader added meanwhile: the partial unique index refused the second
                raise Conflict("this space already has a leader; a space has at most one", field="role") from None
            events.emit(member.space_id, "member.updated", member=member, fields=changed, actor=actor)
        if cron is not None and cron != member.schedule:
            set_schedule(member, cron, actor=actor) if cron else clear_schedule(member, actor=actor)
        if mode is not None and mode != member.permission_mode:
            set_permission_mode(member, mode, actor=actor)
    return _refresh(member)
