"""Skills: add / remove, member-level or space-shared. Changes apply at each member's next run."""
from __future__ import annotations

import re

from django.db import transaction
from django.db.models import Q

from veronica.swarm import audit, events
from veronica.plumbing.compiled_select import fetch
from veronica.plumbing.errors import Conflict, NotFound, VeronicaError, column_limit, require_text
from veronica.models import Member, Skill, Space

NAME_MAX, DESCRIPTION_MAX = column_limit(Skill, "name"), column_limit(Skill, "description")
NAME_RE = re.compile(rf"^[a-z0-9][a-z0-9_-]{{0,{NAME_MAX - 1}}}$")


def clean_skill(name: object, body: object, description: object = "") -> tuple[str, str, str]:
    """add_skill's checks without the write (the admin form shows them as field errors)."""
    name = require_text(name, "name", max_len=NAME_MAX).lower()
    if not NAME_RE.match(name):
        raise VeronicaError(f"name must be lowercase letters, digits, '-' or '_' (at most {NAME_MAX})", field="name")
    body = require_text(body, "body", max_len=50000)
    description = require_text(description, "description", max_len=DESCRIPTION_MAX, allow_empty=True).strip()
    return name, body, description


@audit.verb("skill.add", created=True)
def add_skill(space: Space, name: str, body: str, *, member: Member | None = None, description: str = "",
              overwrite: bool = False, actor: str = "operator") -> Skill:
    name, body, description = clean_skill(name, body, description)
    with transaction.atomic():
        existing = Skill.objects.filter(space=space, member=member, name=name).first()
        if existing and not overwrite:
            raise Conflict(f"a skill named '{name}' already exists here; pass overwrite to replace it", field="name")
        skill = existing or Skill(space=space, member=member, name=name)
        skill.body, skill.description = body, description
        skill.save()
        events.emit(space.pk, "skill.added", member=member, name=name, scope=skill.scope, actor=actor, replaced=bool(existing))
    return skill


@audit.verb("skill.remove")
def remove_skill(space: Space, name: str, *, member: Member | None = None, actor: str = "operator") -> None:
    name = require_text(name, "name", max_len=NAME_MAX)
    with transaction.atomic():
        deleted, _ = Skill.objects.filter(space=space, member=member, name=name).delete()
        if not deleted:
            raise NotFound(f"no {'member' if member else 'shared'} skill named '{name}'", field="name")
        events.emit(space.pk, "skill.removed", member=member, name=name, scope="member" if member else "shared", actor=actor)


def skills_for(member: Member) -> list[Skill]:
    """The member's catalog: shared skills, overridden by its own of the same name."""
    rows = fetch(("skills-of",), lambda s: Skill.objects.filter(Q(space_id=s.int("space"), member__isnull=True) |
                                                                 Q(member_id=s.int("member"))),
                 {"space": member.space_id, "member": member.pk})  # one query per run, compiled once
    shared = {s.name: s for s in rows if s.member_id is None}
    shared.update({s.name: s for s in rows if s.member_id is not None})
    return [shared[k] for k in sorted(shared)]
