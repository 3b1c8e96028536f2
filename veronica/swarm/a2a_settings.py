"""A space's A2A settings, one verb each (console, API, manifest and admin call these): serve on or
off, which members besides the leader are agents, the callers' bearer credentials (shown once, only
their SHA-256 kept), and the remote agents members may call (a2a__<name>).

Remote agents are declared by their card URL; the internal-address guard (veronica.ops.outbound, A2A
purpose) applies when saved and again on every request. A remote's token is best given as
`${secret:NAME}`: the value then stays encrypted at rest with the space's other secrets, is resolved
at each request (the calling member's own secret over the space's) and masked in transcripts, and
the reference travels in an export; a literal token is kept as given and scrubbed from exports."""
from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.db import transaction
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from veronica.swarm import access, audit, events
from veronica.swarm import secrets as space_secrets
from veronica.ops import outbound
from veronica.plumbing.errors import Conflict, NotFound, VeronicaError, column_limit, require_text, text_problem
from veronica.models import A2AConfig, A2ACredential, A2ARemote, Member, Role, Space

KEY_PREFIX = "a2a_"
ROLES = (access.VIEWER, access.OPERATOR)  # a caller reads (viewer) or also sends and cancels (operator)
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
TIMEOUT_RANGE = (1, 3600)
REMOTE_KEYS = {"name", "card_url", "timeout", "token"}
TOUCH_EVERY = access.TOKEN_TOUCH_EVERY


def config(space: Space) -> A2AConfig:
    """The settings as stored, or the defaults (unsaved: a read never writes a row)."""
    return A2AConfig.objects.filter(space=space).first() or A2AConfig(space=space)


def _stored(space: Space) -> A2AConfig:
    return A2AConfig.objects.select_for_update().get_or_create(space=space)[0]


@audit.verb("a2a.serve", after=lambda given, cfg: {"enabled": cfg.enabled})
def set_enabled(space: Space, enabled: object, *, actor: str) -> A2AConfig:
    if not isinstance(enabled, bool):
        raise VeronicaError("enabled must be true or false", field="enabled")
    with transaction.atomic():
        cfg = _stored(space)
        cfg.enabled = enabled
        cfg.save(update_fields=["enabled", "updated_at"])
        events.emit(space.pk, "a2a.enabled" if enabled else "a2a.disabled", by=actor)
    return cfg


def check_members(space: Space | None, names: object) -> list[str]:
    if not isinstance(names, list) or len(names) > 100 or not all(isinstance(n, str) and n.strip() for n in names):
        raise VeronicaError("members must be a list of at most 100 member names", field="a2a.members")
    names = list(dict.fromkeys(n.strip() for n in names))
    if space is not None:
        known = set(Member.objects.filter(space=space, removed_at__isnull=True).values_list("name", flat=True))
        unknown = [n for n in names if n not in known]
        if unknown:
            raise VeronicaError(f"members: no member named '{unknown[0]}' in space {space.slug}", field="a2a.members")
    return names


@audit.verb("a2a.members", after=lambda given, cfg: {"members": list(cfg.members)})
def set_members(space: Space, names: object, *, actor: str) -> A2AConfig:
    """The members the owner exposes as agents of their own (the leader is the space's agent)."""
    checked = check_members(space, names)
    with transaction.atomic():
        cfg = _stored(space)
        cfg.members = checked
        cfg.save(update_fields=["members", "updated_at"])
        events.emit(space.pk, "a2a.members", by=actor, members=checked)
    return cfg


def agent_member(space: Space, member_name: str | None) -> Member | None:
    """The member an A2A address names: the leader for the space, a named member only if exposed."""
    members = Member.objects.filter(space=space, removed_at__isnull=True)
    if member_name is None:
        return members.filter(role=Role.LEADER).order_by("pk").first()
    if member_name not in config(space).members:
        return None
    return members.filter(name=member_name).first()


# --- callers' credentials ----------------------------------------------------------------------------

@audit.verb("a2a.credential.create", after=lambda given, result: {"name": result[0].name, "role": result[0].role})
def create_credential(space: Space, name: object, role: object, *, actor: str) -> tuple[A2ACredential, str]:
    """A new bearer key for one outside agent; the key is returned once, never stored or shown again."""
    name = require_text(name, "name", max_len=column_limit(A2ACredential, "name")).strip()
    if not NAME_RE.match(name):
        raise VeronicaError("name: lowercase letters, digits, '-' or '_' (it names the caller in the chat)", field="name")
    if role not in ROLES:
        raise VeronicaError(f"role must be one of {', '.join(ROLES)}", field="role")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        cred = A2ACredential.objects.create(space=space, name=name, role=role, key_hash=access.hash_key(key),
                                            prefix=key[:10], created_by=actor)
        events.emit(space.pk, "a2a.credential_created", by=actor, name=name, role=role, id=cred.pk)
    return cred, key


@audit.verb("a2a.credential.revoke", target=lambda given, cred: cred.name, after=lambda given, cred: {"revoked": True})
def revoke_credential(space: Space, credential_id: object, *, actor: str) -> A2ACredential:
    cred = A2ACredential.objects.filter(space=space, pk=credential_id if isinstance(credential_id, int) else -1).first()
    if cred is None:
        raise NotFound(f"no A2A credential #{credential_id} in this space", field="credential_id")
    with transaction.atomic():
        if A2ACredential.objects.filter(pk=cred.pk, revoked_at__isnull=True).update(revoked_at=timezone.now()):
            events.emit(space.pk, "a2a.credential_revoked", by=actor, name=cred.name, id=cred.pk)
    cred.refresh_from_db()
    return cred


def credential_for_key(space: Space, key: str) -> A2ACredential | None:
    """The live credential of this space the key is, or None (unknown, revoked, another space's)."""
    if not key or not key.startswith(KEY_PREFIX) or len(key) > 200:
        return None
    digest = access.hash_key(key)
    cred = A2ACredential.objects.filter(key_hash=digest, revoked_at__isnull=True).first()
    if cred is None or cred.space_id != space.pk or not constant_time_compare(cred.key_hash, digest):
        return None
    now = timezone.now()
    if cred.last_used_at is None or now - cred.last_used_at > TOUCH_EVERY:
        A2ACredential.objects.filter(pk=cred.pk).update(last_used_at=now)
    return cred


# --- remote agents ---------------------------------------------------------------------------------

@dataclass
class RemoteConfig:
    name: str
    card_url: str
    timeout: int = 60
    token: str = ""


def check_remote(cfg: object) -> RemoteConfig:
    """One declaration ({name, card_url, timeout, token}); errors name the field."""
    if not isinstance(cfg, dict):
        raise VeronicaError("each remote must be a table with name and card_url", field="a2a.remotes")
    unknown = sorted(set(cfg) - REMOTE_KEYS)
    if unknown:
        raise VeronicaError(f"unknown key (known: {', '.join(sorted(REMOTE_KEYS))})", field=f"a2a.remotes.{unknown[0]}")
    name, limit = cfg.get("name"), column_limit(A2ARemote, "name")
    if not isinstance(name, str) or not NAME_RE.match(name) or len(name) > limit:
        raise VeronicaError(f"lowercase letters, digits, '-' or '_', 1 to {limit} characters", field="a2a.remotes.name")
    url, ulimit = cfg.get("card_url"), column_limit(A2ARemote, "card_url")
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc or len(url) > ulimit or text_problem(url):
        raise VeronicaError(f"must be an http:// or https:// URL of at most {ulimit} characters", field=f"a2a.remotes.{name}.card_url")
    outbound.check_url(url, f"a2a.remotes.{name}.card_url", outbound.A2A)  # no internal addresses in hosted mode
    timeout = cfg.get("timeout", 60)
    low, high = TIMEOUT_RANGE
    if not isinstance(timeout, int) or isinstance(timeout, bool) or not low <= timeout <= high:
        raise VeronicaError(f"must be an integer number of seconds from {low} to {high}", field=f"a2a.remotes.{name}.timeout")
    token = cfg.get("token", "")
    if not isinstance(token, str) or len(token) > column_limit(A2ARemote, "token") or text_problem(token):
        raise VeronicaError("must be a string of at most 500 characters", field=f"a2a.remotes.{name}.token")
    if "${secret:" in token and not space_secrets.REFERENCE_RE.fullmatch(token):
        raise VeronicaError("a secret is named as the whole token: ${secret:NAME}, NAME in A-Z, 0-9 and '_'",
                            field=f"a2a.remotes.{name}.token")
    return RemoteConfig(name=name, card_url=url, timeout=timeout, token=token)


def _bearer_of(token: str, name: str, space_id: int, member: Member | None) -> str:
    reference = space_secrets.REFERENCE_RE.fullmatch(token)
    if reference is None:
        return token
    known = space_secrets.values_for(space_id, member)
    if reference.group(1) not in known:
        raise VeronicaError(f"names secret {reference.group(1)}, which is not set for "
                            f"{member.name + ' or ' if member else ''}the space", field=f"a2a.remotes.{name}.token")
    return known[reference.group(1)][0]


def bearer(remote: A2ARemote, member: Member | None = None) -> str:
    """The token a request to `remote` carries: a `${secret:NAME}` reference resolved now, or the
    literal token (VeronicaError naming the field when the secret is not set)."""
    return _bearer_of(remote.token, remote.name, remote.space_id, member)


def check_remote_list(entries: object) -> list[RemoteConfig]:
    if not isinstance(entries, list):
        raise VeronicaError("must be an array of tables ([[a2a.remotes]])", field="a2a.remotes")
    configs = [check_remote(e) for e in entries]
    names = [c.name for c in configs]
    for name in names:
        if names.count(name) > 1:
            raise VeronicaError("declared twice", field=f"a2a.remotes.{name}")
    return configs


@audit.verb("a2a.remote.add", target=lambda given, remote: remote.name,
            after=lambda given, remote: {"card_url": remote.card_url, "timeout": remote.timeout, "bearer_set": bool(remote.token)})
def add_remote(space: Space, cfg: RemoteConfig, *, actor: str, from_manifest: bool = False, fetch_card: bool = True) -> A2ARemote:
    """Declare a remote agent. With fetch_card (the console, the API) its card is read now, so a
    wrong URL is an error here; the manifest defers it to the first call (the agent may start later)."""
    from veronica.swarm import a2a_client

    if A2ARemote.objects.filter(space=space, name=cfg.name).exists():
        raise Conflict(f"a remote A2A agent named '{cfg.name}' is already declared here", field="name")
    endpoint, description = "", ""
    if fetch_card:
        token = _bearer_of(cfg.token, cfg.name, space.pk, None)
        card = a2a_client.fetch_card(cfg.card_url, token=token, timeout=min(cfg.timeout, 30))
        endpoint, description = card.endpoint, card.description
    with transaction.atomic():
        remote = A2ARemote.objects.create(space=space, name=cfg.name, card_url=cfg.card_url, endpoint=endpoint,
                                          description=description[:2000], token=cfg.token, timeout=cfg.timeout,
                                          from_manifest=from_manifest)
        events.emit(space.pk, "a2a.remote_added", by=actor, remote=cfg.name, card_url=outbound.scrub_url(cfg.card_url))
    return remote


@audit.verb("a2a.remote.remove")
def remove_remote(space: Space, name: str, *, actor: str) -> None:
    with transaction.atomic():
        deleted, _ = A2ARemote.objects.filter(space=space, name=name).delete()
        if not deleted:
            raise NotFound(f"no remote A2A agent named '{name}'", field="name")
        events.emit(space.pk, "a2a.remote_removed", by=actor, remote=name)


def _manifest_row(given: dict, result) -> dict | None:
    """The [a2a] table as the audit row shows it: a remote's token only as set or not (the default,
    the call's arguments, would write each RemoteConfig's repr, token and all)."""
    table = given.get("table")
    if table is None:
        return None
    return {"enabled": table.get("enabled"), "members": list(table.get("members", [])),
            "remotes": [{"name": r.name, "card_url": r.card_url, "timeout": r.timeout, "bearer_set": bool(r.token)}
                        for r in table.get("remotes", [])]}


@audit.verb("a2a.manifest", after=_manifest_row)
def apply_manifest(space: Space, table: dict | None, *, actor: str) -> None:
    """A register: [a2a] sets serving and exposed members; its remotes replace the earlier manifest's
    (console-added ones stay unless the manifest declares the same name). A token the manifest
    leaves empty (an export scrubs it) keeps the one stored under that name."""
    if table is None:
        return
    set_enabled(space, table.get("enabled", False), actor=actor)
    set_members(space, table.get("members", []), actor=actor)
    remotes = table.get("remotes", [])
    kept = dict(A2ARemote.objects.filter(space=space, name__in=[r.name for r in remotes]).values_list("name", "token"))
    A2ARemote.objects.filter(space=space, from_manifest=True).delete()
    A2ARemote.objects.filter(space=space, name__in=[r.name for r in remotes]).delete()
    for cfg in remotes:
        cfg.token = cfg.token or kept.get(cfg.name, "")
        add_remote(space, cfg, actor=actor, from_manifest=True, fetch_card=False)


def check_manifest_table(table: object) -> dict:
    """[a2a] in space.toml: enabled, members (names checked when applied), [[a2a.remotes]]."""
    if not isinstance(table, dict):
        raise VeronicaError("must be a table ([a2a])", field="a2a")
    unknown = sorted(set(table) - {"enabled", "members", "remotes"})
    if unknown:
        raise VeronicaError("unknown key (known: enabled, members, remotes)", field=f"a2a.{unknown[0]}")
    if not isinstance(table.get("enabled", False), bool):
        raise VeronicaError("must be true or false", field="a2a.enabled")
    return {"enabled": table.get("enabled", False), "members": check_members(None, table.get("members", [])),
            "remotes": check_remote_list(table.get("remotes", []))}


def _exported_token(token: str) -> str:
    return token if space_secrets.REFERENCE_RE.fullmatch(token) else ""


def export_table(space: Space) -> dict | None:
    """[a2a] as the manifest declares it: credentials are never exported, literal remote tokens are
    scrubbed (a `${secret:NAME}` reference is not a secret and stays), and so are a card URL's
    user:password@ and query string (as an MCP server's URL)."""
    cfg = A2AConfig.objects.filter(space=space).first()
    remotes = list(A2ARemote.objects.filter(space=space).order_by("name"))
    if (cfg is None or not cfg.enabled and not cfg.members) and not remotes:
        return None
    table: dict = {"enabled": bool(cfg and cfg.enabled), "members": list(cfg.members if cfg else [])}
    if remotes:
        table["remotes"] = [{"name": r.name, "card_url": outbound.scrub_url(r.card_url), "timeout": r.timeout, **({"token": _exported_token(r.token)} if r.token else {})}
                            for r in remotes]
    return table


def status(space: Space) -> dict:
    """What the console and the API show (viewers too): never a key, a token, a hash, or a URL's
    user:password@ or query string (a credential the owner put in the card URL)."""
    cfg = config(space)
    return {
        "enabled": cfg.enabled, "members": list(cfg.members),
        "card_url": f"/a2a/{space.slug}/.well-known/agent-card.json",
        "credentials": [{"id": c.pk, "name": c.name, "role": c.role, "prefix": c.prefix, "created_at": c.created_at.isoformat(),
                         "last_used_at": c.last_used_at.isoformat() if c.last_used_at else None,
                         "revoked": c.revoked_at is not None} for c in A2ACredential.objects.filter(space=space)],
        "remotes": [{"name": r.name, "card_url": outbound.scrub_url(r.card_url), "endpoint": outbound.scrub_url(r.endpoint), "timeout": r.timeout,
                     "token_set": bool(r.token),
                     "token_secret": (m.group(1) if (m := space_secrets.REFERENCE_RE.fullmatch(r.token)) else None), "tool": f"a2a__{r.name}"} for r in A2ARemote.objects.filter(space=space)],
    }
