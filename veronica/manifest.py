"""Manifest import: a folder describes a space; `register` creates or refreshes it.

Layout:  space.toml · persona/skills per member under members/<name>/ · shared skills under skills/.
Everything is parsed and validated first (errors name the file and the field); only then is the
space written, in one transaction, so a bad manifest changes nothing.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify

from veronica import events
from veronica.agent.providers import validate_model_spec
from veronica.engine import supervisor
from veronica.engine.timers import arm_cron
from veronica.errors import VeronicaError
from veronica.models import Member, Membership, Origin, PermissionMode, Role, RunStatus, Skill, Space

SPACE_SETTINGS = {
    "member_daily_tokens": int, "daily_token_ceiling": int, "daily_usd_ceiling": float, "blackboard_cap": int,
    "stale_task_minutes": int, "retention_days": int, "spawn_cap": int, "default_permission_mode": str,
    "webhook_secret": str, "rule_review_required": bool, "stuck_run_minutes": int, "mailbox_backlog_minutes": int,
}
NOTIFY_KEYS = {"webhook_url", "slack_url", "email"}
MEMBER_KEYS = {"role", "model", "schedule", "permission_mode", "when_to_use", "rule_domains", "budget", "max_iterations"}


class ManifestError(VeronicaError):
    def __init__(self, path: Path, field_name: str, problem: str) -> None:
        super().__init__(f"{path}: {field_name}: {problem}", field=field_name)


@dataclass
class MemberSpec:
    name: str
    role: str
    model: str
    persona: str
    when_to_use: str = ""
    schedule: str = ""
    permission_mode: str = ""
    rule_domains: list[str] = field(default_factory=list)
    budget: int | None = None
    max_iterations: int = 24
    skills: dict[str, tuple[str, str]] = field(default_factory=dict)


@dataclass
class SpaceSpec:
    name: str
    slug: str
    workdir: Path
    settings: dict
    members: list[MemberSpec]
    shared_skills: dict[str, tuple[str, str]]
    path: Path


def _toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ManifestError(path, "file", "missing") from None
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(path, "syntax", str(exc)) from None


def _skill(path: Path) -> tuple[str, str]:
    """A skill file: optional '---\\ndescription: ...\\n---' front matter, then markdown."""
    text = path.read_text()
    description = ""
    if text.startswith("---\n"):
        head, sep, body = text[4:].partition("\n---\n")
        if not sep:
            raise ManifestError(path, "front matter", "opened with '---' but never closed")
        for line in head.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "description":
                description = value.strip()
        text = body
    if not text.strip():
        raise ManifestError(path, "body", "a skill needs a markdown body")
    return description[:300], text.strip()


def _skills(folder: Path) -> dict[str, tuple[str, str]]:
    if not folder.is_dir():
        return {}
    return {p.stem.lower(): _skill(p) for p in sorted(folder.glob("*.md"))}


def _member(folder: Path) -> MemberSpec:
    cfg_path = folder / "member.toml"
    cfg = _toml(cfg_path)
    unknown = set(cfg) - MEMBER_KEYS
    if unknown:
        raise ManifestError(cfg_path, sorted(unknown)[0], f"unknown key (known: {', '.join(sorted(MEMBER_KEYS))})")
    role = cfg.get("role", Role.WORKER)
    if role not in Role.values:
        raise ManifestError(cfg_path, "role", f"must be one of {', '.join(Role.values)}")
    model = cfg.get("model", "offline")
    try:
        validate_model_spec(model)
        schedule = supervisor.validate_cron(cfg["schedule"]) if cfg.get("schedule") else ""
    except VeronicaError as exc:
        raise ManifestError(cfg_path, exc.field, exc.message) from None
    mode = cfg.get("permission_mode", "")
    if mode and mode not in PermissionMode.values:
        raise ManifestError(cfg_path, "permission_mode", f"must be one of {', '.join(PermissionMode.values)}")
    domains = cfg.get("rule_domains", [])
    if not isinstance(domains, list) or not all(isinstance(d, str) for d in domains):
        raise ManifestError(cfg_path, "rule_domains", "must be a list of strings")
    budget = cfg.get("budget")
    if budget is not None and not isinstance(budget, int):
        raise ManifestError(cfg_path, "budget", "must be an integer (>0 caps, <0 unlimited)")
    iterations = cfg.get("max_iterations", 24)
    if not isinstance(iterations, int) or not 1 <= iterations <= 200:
        raise ManifestError(cfg_path, "max_iterations", "must be an integer from 1 to 200")
    persona_path = folder / "persona.md"
    if not persona_path.is_file():
        raise ManifestError(persona_path, "file", "missing: every member needs a persona.md")
    return MemberSpec(name=folder.name, role=role, model=model, persona=persona_path.read_text().strip(),
                      when_to_use=str(cfg.get("when_to_use", "")), schedule=schedule, permission_mode=mode,
                      rule_domains=domains, budget=budget, max_iterations=iterations, skills=_skills(folder / "skills"))


def _ops_settings(space_path: Path, cfg: dict) -> dict:
    """`verify_checks` (an array of {name, command, timeout} tables) and the `[notify]` table. Only
    what the manifest states is applied, so a notifier an owner set in the console survives a register
    of a manifest that has none."""
    from veronica import notify
    from veronica.engine import checks

    out: dict = {}
    if "verify_checks" in cfg:
        try:
            out["verify_checks"] = checks.clean_spec(cfg["verify_checks"])
        except VeronicaError as exc:
            raise ManifestError(space_path, "verify_checks", exc.message) from None
    if "notify" not in cfg:
        return out
    table = cfg["notify"]
    if not isinstance(table, dict):
        raise ManifestError(space_path, "notify", "must be a table with webhook_url, slack_url, email")
    unknown = set(table) - NOTIFY_KEYS
    if unknown:
        raise ManifestError(space_path, f"notify.{sorted(unknown)[0]}", f"unknown key (known: {', '.join(sorted(NOTIFY_KEYS))})")
    try:
        out["notify_webhook_url"] = notify.clean_url(table.get("webhook_url"), "webhook_url")
        out["notify_slack_url"] = notify.clean_url(table.get("slack_url"), "slack_url")
        out["notify_emails"] = notify.clean_emails(table.get("email"), "email")
    except VeronicaError as exc:
        raise ManifestError(space_path, f"notify.{exc.field}", exc.message) from None
    return out


def load(directory: str | Path) -> SpaceSpec:
    root = Path(directory).resolve()
    if not root.is_dir():
        raise ManifestError(root, "directory", "not a folder")
    space_path = root / "space.toml"
    cfg = _toml(space_path)
    name = cfg.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ManifestError(space_path, "name", "required, a non-empty string")
    slug = cfg.get("slug") or slugify(name)
    if slug != slugify(slug):
        raise ManifestError(space_path, "slug", "lowercase letters, digits and '-' only")
    workdir = (root / cfg.get("workdir", "workspace")).resolve()
    if not workdir.is_dir():
        raise ManifestError(space_path, "workdir", f"{workdir} is not a folder")
    settings = cfg.get("settings", {})
    for key, value in settings.items():
        kind = SPACE_SETTINGS.get(key)
        if kind is None:
            raise ManifestError(space_path, f"settings.{key}", f"unknown setting (known: {', '.join(sorted(SPACE_SETTINGS))})")
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ManifestError(space_path, f"settings.{key}", f"must be {kind.__name__}")
    settings = {**settings, **_ops_settings(space_path, cfg)}
    members_dir = root / "members"
    members = [_member(d) for d in sorted(members_dir.iterdir()) if d.is_dir()] if members_dir.is_dir() else []
    leaders = [m.name for m in members if m.role == Role.LEADER]
    if len(leaders) != 1:
        raise ManifestError(members_dir, "role", f"a space needs exactly one leader; found {len(leaders)} ({', '.join(leaders) or 'none'})")
    return SpaceSpec(name=name.strip(), slug=slug, workdir=workdir, settings=settings, members=members,
                     shared_skills=_skills(root / "skills"), path=root)


def register(directory: str | Path, *, actor: str = "register") -> Space:
    """A fresh register: the manifest as written wins; runtime overrides and clones are discarded."""
    spec = load(directory)
    with transaction.atomic():
        space, created = Space.objects.get_or_create(slug=spec.slug, defaults={"name": spec.name, "workdir": str(spec.workdir)})
        space.name, space.workdir, space.manifest_path = spec.name, str(spec.workdir), str(spec.path)
        for key, value in spec.settings.items():
            setattr(space, key, value)
        space.save()
        _apply_members(space, spec, actor)
        Skill.objects.filter(space=space, member__isnull=True).delete()
        for skill_name, (description, body) in spec.shared_skills.items():
            Skill.objects.create(space=space, name=skill_name, description=description, body=body)
        Member.objects.filter(space=space, removed_at__isnull=True).update(reload_pending=True)
        events.emit(space.pk, "space.registered", actor=actor, created=created, members=[m.name for m in spec.members])
    return space


def _apply_members(space: Space, spec: SpaceSpec, actor: str) -> None:
    now = timezone.now()
    wanted = {m.name for m in spec.members}
    live = {m.name: m for m in Member.objects.filter(space=space, removed_at__isnull=True)}
    # clones and members gone from the manifest leave (history kept); leader changes need the slot free
    for name, member in live.items():
        if name not in wanted or member.spawned_from_id:
            Member.objects.filter(pk=member.pk).update(removed_at=now, membership=Membership.FROZEN)
            events.emit(space.pk, "member.removed", member=member, actor=actor, reason="not in manifest")
    Member.objects.filter(space=space, removed_at__isnull=True, role=Role.LEADER).exclude(
        name__in=[m.name for m in spec.members if m.role == Role.LEADER]).update(role=Role.WORKER)
    for ms in spec.members:
        fields = dict(role=ms.role, model=ms.model, persona=ms.persona, when_to_use=ms.when_to_use,
                      permission_mode=ms.permission_mode or space.default_permission_mode, permission_origin=Origin.MANIFEST,
                      schedule=ms.schedule, schedule_origin=Origin.MANIFEST, schedule_set_at=None, schedule_tombstone=False,
                      schedule_next_at=supervisor.next_fire(ms.schedule) if ms.schedule else None,
                      rule_domains=ms.rule_domains, budget_override=ms.budget, max_iterations=ms.max_iterations)
        member = live.get(ms.name) if ms.name in live and not live[ms.name].spawned_from_id else None
        if member is None:
            member = Member.objects.create(space=space, name=ms.name, phase_since=now, **fields)
            events.emit(space.pk, "member.added", member=member, actor=actor, role=ms.role, model=ms.model)
        else:
            Member.objects.filter(pk=member.pk).update(**fields)
        arm_cron(member.pk, fields["schedule_next_at"])
        Skill.objects.filter(member=member).delete()
        for skill_name, (description, body) in ms.skills.items():
            Skill.objects.create(space=space, member=member, name=skill_name, description=description, body=body)
