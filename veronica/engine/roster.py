"""The roster verbs a leader's tools call too: spawn and retire clones (and remove a member), set and
clear a member's schedule. Split out of veronica.engine.supervisor, which checks a member's tool set
against the agent's tool table: the tools import these, so they must not sit in the module that
imports the tools (supervisor re-exports them; every door still calls supervisor.*)."""
from __future__ import annotations

from django.db import transaction
from django.db.models import BooleanField, Case, F, Value, When
from django.utils import timezone

from veronica.swarm import audit, events
from veronica.engine.cron import next_fire, validate_cron
from veronica.engine.timers import arm_cron
from veronica.plumbing.errors import Conflict, NotFound, VeronicaError
from veronica.models import Member, Membership, Origin, RetirePolicy, Role, RunStatus, Skill, Space

# True while a run holds the slot: that run must see the cancel at its next step.
HAS_LEASE = Case(When(lease_token="", then=Value(False)), default=Value(True), output_field=BooleanField())


def _refresh(member: Member) -> Member:
    member.refresh_from_db()
    return member


def is_busy(member: Member) -> bool:
    return member.run_status == RunStatus.BUSY or bool(member.lease_token)


@audit.verb("member.remove", watch="member")
def remove_member(member: Member, *, actor: str) -> Member:
    """Retire a worker: no more runs or mail; its messages, tasks, transcript and events stay."""
    if member.role == Role.LEADER:
        raise Conflict("the leader cannot be removed", field="member")
    with transaction.atomic():
        if not Member.objects.filter(pk=member.pk, removed_at__isnull=True).update(
                removed_at=timezone.now(), membership=Membership.FROZEN, cancel_requested=HAS_LEASE, removed_by=actor[:80]):
            raise NotFound(f"member '{member.name}' is already removed", field="member")
        events.emit(member.space_id, "member.removed", member=member, actor=actor)
    return _refresh(member)


@audit.verb("member.spawn", created=True)
def spawn(base: Member, *, retire_policy: str = RetirePolicy.ON_COMPLETE, actor: str, capped: bool = True) -> Member:
    """Clone a worker into a live ephemeral member; schedules never clone. The space's cap gates the
    agent-driven path (the leader's tool) only: an operator's spawn is uncapped (`capped=False`)."""
    if retire_policy not in (RetirePolicy.ON_COMPLETE, RetirePolicy.MANUAL):
        raise VeronicaError("retire must be 'on_complete' or 'manual'", field="retire")
    if base.role != Role.WORKER or base.spawned_from_id:
        raise VeronicaError(f"only manifest workers can be cloned; '{base.name}' is not one", field="base")
    space = base.space
    with transaction.atomic():
        Space.objects.select_for_update().filter(pk=space.pk).first()  # serialize spawns per space (PG)
        live = Member.objects.filter(space=space, spawned_from__isnull=False, removed_at__isnull=True).count()
        if capped and live >= space.spawn_cap:
            raise Conflict(f"spawn cap reached: {live} live clones, the space allows {space.spawn_cap}", field="base")
        Member.objects.filter(pk=base.pk).update(clone_seq=F("clone_seq") + 1)
        seq = Member.objects.filter(pk=base.pk).values_list("clone_seq", flat=True).get()
        clone = Member.objects.create(
            space=space, name=f"{base.name}-{seq}", role=Role.WORKER, persona=base.persona, when_to_use=base.when_to_use,
            model=base.model, permission_mode=base.permission_mode, rule_domains=base.rule_domains,
            budget_override=base.budget_override, tools=base.tools, deferred_tools=base.deferred_tools, spawned_from=base,
            retire_policy=retire_policy, phase_since=timezone.now(), origin=Origin.RUNTIME)
        for skill in Skill.objects.filter(member=base):
            Skill.objects.create(space=space, member=clone, name=skill.name, description=skill.description, body=skill.body)
        events.emit(space.pk, "member.spawned", member=clone, base=base.name, retire=retire_policy, actor=actor)
    return clone


@audit.verb("member.retire", watch="member")
def retire(member: Member, *, actor: str) -> Member:
    if not member.spawned_from_id:
        raise VeronicaError(f"'{member.name}' is a manifest member; only spawned clones can be retired", field="member")
    if is_busy(_refresh(member)):
        raise Conflict(f"'{member.name}' is mid-run; retire it once it is idle", field="member")
    removed = remove_member(member, actor=actor)
    events.emit(member.space_id, "member.retired", member=member, actor=actor)
    return removed


@audit.verb("member.schedule_set", watch="member")
def set_schedule(member: Member, cron: str, *, actor: str) -> Member:
    cron = validate_cron(cron)
    with transaction.atomic():
        next_at = next_fire(cron)
        Member.objects.filter(pk=member.pk).update(schedule=cron, schedule_origin=Origin.RUNTIME, schedule_set_at=timezone.now(),
                                                   schedule_tombstone=False, schedule_next_at=next_at)
        arm_cron(member.pk, next_at)
        events.emit(member.space_id, "member.schedule_set", member=member, schedule=cron, actor=actor)
    return _refresh(member)


@audit.verb("member.schedule_clear", watch="member")
def clear_schedule(member: Member, *, actor: str) -> Member:
    """Writes a tombstone: the clear survives restarts and beats the manifest until a fresh register."""
    with transaction.atomic():
        Member.objects.filter(pk=member.pk).update(schedule="", schedule_origin=Origin.RUNTIME, schedule_set_at=timezone.now(),
                                                   schedule_tombstone=True, schedule_next_at=None)
        arm_cron(member.pk, None)
        events.emit(member.space_id, "member.schedule_cleared", member=member, actor=actor)
    return _refresh(member)
