"""The secrets verbs: a space owner stores named secrets (API keys for MCP servers and tools) for the
whole space or for one member; they are encrypted at rest (veronica.plumbing.secret_store), never shown
again, never exported, and injected only where declared:

* an MCP server's env value `${secret:NAME}` (stdio servers) is replaced when the server starts;
* a secret marked `in_commands` is an environment variable of the member's run_command;
* a secret named OPENAI_API_KEY or ANTHROPIC_API_KEY is that member's provider key (the member's
  own wins over the space's, which wins over the server's environment).

A member's own secret of a name shadows the space's. Every door (console, API, admin, command)
calls these functions.
"""
from __future__ import annotations

import re

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from veronica.swarm import audit, events
from veronica.plumbing import secret_store
from veronica.plumbing.compiled_select import fetch
from veronica.plumbing.errors import NotFound, VeronicaError, column_limit, text_problem
from veronica.models import Member, Secret, Space

NAME_RE = re.compile(r"^[A-Z_][A-Z0-9_]*$")
NAME_MAX = column_limit(Secret, "name")
VALUE_MAX = 8000
MAX_PER_SPACE = 200
REFERENCE_RE = re.compile(r"\$\{secret:([A-Z_][A-Z0-9_]*)\}")
PROVIDER_KEYS = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}


def _scope(space: Space, member: Member | None):
    return Secret.objects.filter(space=space, member=member)


def check_name(name: object) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name) or len(name) > NAME_MAX:
        raise VeronicaError(f"name must be an environment-variable name: A-Z, 0-9 and '_', 1 to {NAME_MAX} characters, "
                            "not starting with a digit", field="name")
    return name


def check_value(value: object) -> str:
    low = secret_store.MIN_VALUE
    if not isinstance(value, str) or not low <= len(value) <= VALUE_MAX or text_problem(value) or "\n" in value:
        raise VeronicaError(f"value must be one line of {low} to {VALUE_MAX} characters", field="value")
    return value


def _secret_target(given: dict, result) -> str:
    member = given.get("member")
    return f"{member.name}:{given['name']}" if member is not None else str(given["name"])


def _secret_after(given: dict, result) -> dict:  # never the value: names and where it applies
    member = given.get("member")
    return {"name": given["name"], "member": member.name if member is not None else None,
            "in_commands": given.get("in_commands", False)}


@audit.verb("secret.set", target=_secret_target, after=_secret_after)
def set_secret(space: Space, name: str, value: str, *, member: Member | None = None, in_commands: bool = False,
               actor: str) -> Secret:
    """Store (or replace) a secret. The value is encrypted here and never returned by anything."""
    name, value = check_name(name), check_value(value)
    if member is not None and member.space_id != space.pk:
        raise VeronicaError(f"{member.name} is not a member of space {space.slug}", field="member")
    if not isinstance(in_commands, bool):
        raise VeronicaError("in_commands must be true or false", field="in_commands")
    ciphertext = secret_store.encrypt(_key_ready(value))
    with transaction.atomic():
        secret = _scope(space, member).select_for_update().filter(name=name).first()
        if secret is None:
            if Secret.objects.filter(space=space).count() >= MAX_PER_SPACE:
                raise VeronicaError(f"a space holds at most {MAX_PER_SPACE} secrets", field="name")
            secret = Secret.objects.create(space=space, member=member, name=name, ciphertext=ciphertext, in_commands=in_commands)
            created = True
        else:
            secret.ciphertext, secret.in_commands = ciphertext, in_commands
            secret.save(update_fields=["ciphertext", "in_commands", "updated_at"])
            created = False
        secret_store.remember(name, value, space.pk)
        events.emit(space.pk, "secret.set", member=member, actor=actor, name=name, created=created, in_commands=in_commands)
    return secret


def _key_ready(value: str) -> str:
    try:
        secret_store.fernet()
    except secret_store.KeyMissing as exc:
        raise VeronicaError(str(exc), field="value") from None
    return value


@audit.verb("secret.delete", target=_secret_target, after=lambda given, result: None)
def delete_secret(space: Space, name: str, *, member: Member | None = None, actor: str) -> None:
    with transaction.atomic():
        deleted, _ = _scope(space, member).filter(name=name).delete()
        if not deleted:
            raise NotFound(f"no secret named '{name}'" + (f" for {member.name}" if member else " for the space"), field="name")
        events.emit(space.pk, "secret.deleted", member=member, actor=actor, name=name)


def listing(space: Space) -> list[dict]:
    """Names and where they apply; never a value."""
    rows = Secret.objects.filter(space=space).select_related("member").order_by("member__name", "name")
    return [{"name": s.name, "member": s.member.name if s.member else None, "in_commands": s.in_commands,
             "created_at": s.created_at.isoformat(), "updated_at": s.updated_at.isoformat(),
             "rotated_at": s.rotated_at.isoformat() if s.rotated_at else None} for s in rows]


# --- injection ------------------------------------------------------------------------------------------

def _in_reach(space_id: int, member: Member | None):
    """The space's secrets and, for a member, its own."""
    return Secret.objects.filter(Q(member__isnull=True) | Q(member=member) if member else Q(member__isnull=True), space_id=space_id)


def values_for(space_id: int, member: Member | None = None) -> dict[str, tuple[str, bool]]:
    """name -> (value, in_commands) for the member (or the space alone): its own secrets over the space's."""
    rows = _in_reach(space_id, member)
    found: dict[str, tuple[str, bool]] = {}
    for secret in sorted(rows, key=lambda s: s.member_id is not None):  # the space's first, the member's over them
        value = secret_store.decrypt(secret.ciphertext)
        secret_store.remember(secret.name, value, space_id)
        found[secret.name] = (value, secret.in_commands)
    return found


def resolve_env(env: dict[str, str], space_id: int, member: Member | None, *, where: str) -> dict[str, str]:
    """`${secret:NAME}` in env values replaced by the member's secret NAME; an unknown one is an error
    naming the variable (the server does not start with a hole in its environment)."""
    if not any(REFERENCE_RE.search(v) for v in env.values()):
        return dict(env)
    known = values_for(space_id, member)

    def value(key: str, match: re.Match) -> str:
        if match.group(1) not in known:
            raise VeronicaError(f"{where}.env.{key} names secret {match.group(1)}, which is not set for "
                                f"{member.name + ' or ' if member else ''}the space", field=f"{where}.env.{key}")
        return known[match.group(1)][0]

    return {k: REFERENCE_RE.sub(lambda m, k=k: value(k, m), v) for k, v in env.items()}


def command_env(member: Member) -> dict[str, str]:
    """The secrets marked in_commands, as run_command's environment variables."""
    if not _in_reach(member.space_id, member).filter(in_commands=True).exists():
        return {}
    return {name: value for name, (value, in_commands) in values_for(member.space_id, member).items() if in_commands}


def provider_key(member: Member, kind: str) -> str | None:
    """The member's (or its space's) API key for the provider kind, or None: the server's environment."""
    name = PROVIDER_KEYS.get(kind)
    if name is None or not fetch(("provider-key-set",), lambda s: _in_reach(s.int("space"), s.int("member")).filter(  # asked every run: compiled once
            name=s.str("name"))[:1], {"member": member.pk, "space": member.space_id, "name": name}):
        return None
    return values_for(member.space_id, member)[name][0]


# --- the master key ------------------------------------------------------------------------------------------

def rotate_all(batch: int = 200) -> int:
    """Re-encrypt every row under the first key of VERONICA_SECRETS_KEY (MultiFernet.rotate), a few rows
    per transaction so the app keeps running: a row read meanwhile decrypts under either key.
    A row whose ciphertext changed since it was read (someone set it again) is left as it is now."""
    secret_store.fernet()
    done, last = 0, 0
    while True:
        rows = list(Secret.objects.filter(pk__gt=last).order_by("pk").values_list("pk", "ciphertext")[:batch])
        if not rows:
            audit.record("secrets.rotated", after={"rows": done})
            return done
        with transaction.atomic():
            for pk, ciphertext in rows:
                done += Secret.objects.filter(pk=pk, ciphertext=ciphertext).update(
                    ciphertext=secret_store.rotate(ciphertext), rotated_at=timezone.now())
        last = rows[-1][0]
