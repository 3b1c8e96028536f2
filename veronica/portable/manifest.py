"""Manifest import: a folder describes a space; `register` creates or refreshes it.

Layout:  space.toml · persona/skills per member under members/<name>/ · shared skills under skills/ ·
the space's user rules under rules/<domain>.toml (`rules = ["...", ...]`, one domain per file).
Everything is parsed and validated first (errors name the file and the field); only then is the
space written, in one transaction, so a bad manifest changes nothing.

One file past 500 lines on purpose: it is the whole format, parsed and checked top-down in the
order of the folder (space, members, skills, rules); every check names a file and field, and the
write at the end relies on all of them having run.
"""
from __future__ import annotations

import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify

from veronica.swarm import a2a_settings, audit, events, mcp_servers
from veronica.agent.providers import validate_fallback, validate_model_spec
from veronica.engine import supervisor
from veronica.engine.timers import arm_cron
from veronica.plumbing.errors import VeronicaError, column_limit, text_problem
from veronica.models import Member, Membership, Origin, PermissionMode, Role, Skill, Space
from veronica.swarm.skills import NAME_RE as SKILL_NAME_RE

SPACE_SETTINGS = {
    "member_daily_tokens": int, "daily_token_ceiling": int, "daily_usd_ceiling": float, "blackboard_cap": int,
    "stale_task_minutes": int, "retention_days": int, "spawn_cap": int, "default_permission_mode": str,
    "webhook_secret": str, "rule_review_required": bool, "stuck_run_minutes": int, "mailbox_backlog_minutes": int,
}
INT_MAX = 2**31 - 1  # an IntegerField on PostgreSQL
SETTING_RANGES = {  # inclusive bounds a setting must fall in: the column's and what the engine can use
    "member_daily_tokens": (0, INT_MAX), "daily_token_ceiling": (0, INT_MAX), "daily_usd_ceiling": (0, 999_999.9999),
    "blackboard_cap": (100, 1_000_000), "stale_task_minutes": (0, 525_600), "retention_days": (0, 36_500),
    "spawn_cap": (0, 100), "stuck_run_minutes": (0, 525_600), "mailbox_backlog_minutes": (0, 525_600),
}
MAX_SKILL_BODY = 50000  # the skills verb's limit
MAX_TOML_DEPTH = 100  # where a RecursionError from tomllib is looked for, to name the key
NOTIFY_KEYS = {"webhook_url", "slack_url", "email"}
MANIFEST_ACTOR = "manifest"  # Member.removed_by when a register removed it
SPACE_KEYS = {"name", "slug", "workdir", "settings", "notify", "verify_checks", "mcp_servers", "a2a"}
TEMPLATES_DIR = Path(settings.BASE_DIR) / "examples"  # the bundled templates (archive lists them; a space never runs in them)
OWN_WORKDIR = "workspace"  # a space's files: <its own folder>/workspace, beside its manifest copy
MEMBER_KEYS = {"role", "model", "fallback", "schedule", "permission_mode", "when_to_use", "rule_domains", "budget", "max_iterations",
               "mcp_servers", "tools", "deferred_tools"}


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
    mcp_servers: list[mcp_servers.ServerConfig] = field(default_factory=list)
    tools: list[str] | None = None  # None: every tool of the role
    deferred_tools: list[str] = field(default_factory=list)
    fallback: list[str] = field(default_factory=list)  # models tried on overload / outage, in order


@dataclass
class SpaceSpec:
    name: str
    slug: str
    workdir: Path
    settings: dict
    members: list[MemberSpec]
    shared_skills: dict[str, tuple[str, str]]
    path: Path
    mcp_servers: list[mcp_servers.ServerConfig] = field(default_factory=list)
    rules: dict[str, list[str]] = field(default_factory=dict)
    a2a: dict | None = None  # [a2a]: serving, exposed members, remote agents (veronica.swarm.a2a_settings)


def _text_file(path: Path, what: str = "file") -> str:
    """A manifest file's text: UTF-8 and storable (no NUL), or a ManifestError naming it."""
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise ManifestError(path, what, "missing") from None
    except IsADirectoryError:  # an archive may carry a folder by that name: the tenant's mistake, never a 500
        raise ManifestError(path, what, "is a folder, not a file") from None
    except UnicodeDecodeError as exc:
        raise ManifestError(path, what, f"is not UTF-8 text (byte {exc.start})") from None
    if text_problem(text):
        raise ManifestError(path, what, text_problem(text))
    return text


def _storable(path: Path, node: object, key: str = "") -> None:
    """Every string in a parsed TOML file (keys too) can be stored; TOML's \\u0000 escape cannot."""
    if isinstance(node, dict):
        for name, value in node.items():
            child = f"{key}.{name}" if key else name
            if text_problem(name):
                raise ManifestError(path, key or "key", f"a key {text_problem(name)}")
            _storable(path, value, child)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _storable(path, value, f"{key}[{i}]")
    elif isinstance(node, str) and text_problem(node):
        raise ManifestError(path, key, text_problem(node))


def _where(path: Path, text: str, line: int | None, problem: str, exc: Exception) -> ManifestError:
    """A value tomllib cannot take: the error names its key and line (the parser's own error has neither)."""
    if line is None:
        return ManifestError(path, "syntax", f"{problem} ({exc})")
    key = re.match(r"\s*([A-Za-z0-9_.\"' -]+?)\s*=", text.split("\n")[line - 1][:200])  # a key, not a whole line
    return ManifestError(path, key.group(1).strip() if key else "syntax", f"line {line}: {problem}")


def _deep_line(text: str) -> int | None:
    """The first line that opens MAX_TOML_DEPTH arrays or inline tables (a guess: brackets in strings count)."""
    for number, line in enumerate(text.split("\n"), 1):
        if line.count("[") + line.count("{") >= MAX_TOML_DEPTH:
            return number
    return None


def _toml(path: Path) -> dict:
    text = _text_file(path)
    try:
        cfg = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(path, "syntax", str(exc)) from None
    except RecursionError as exc:  # tomllib recurses once per nested array or inline table
        raise _where(path, text, _deep_line(text), "arrays or inline tables nested too deep", exc) from None
    except ValueError as exc:  # Python's int-str conversion limit (a 5,000-digit integer)
        limit = sys.get_int_max_str_digits()
        found = re.search(r"[0-9_]{%d,}" % (limit + 1), text)
        line = text.count("\n", 0, found.start()) + 1 if found else None
        raise _where(path, text, line, f"an integer of more than {limit} digits", exc) from None
    _storable(path, cfg)
    return cfg


def _string(path: Path, cfg: dict, key: str, *, max_len: int, default: str = "") -> str:
    value = cfg.get(key, default)
    if not isinstance(value, str):
        raise ManifestError(path, key, f"must be a string (at most {max_len} characters)")
    if len(value) > max_len:
        raise ManifestError(path, key, f"is {len(value)} characters; the limit is {max_len}")
    return value


def _checked(path: Path, check, *args, **kwargs):
    """Run one of the verbs' validators; its error becomes a manifest error naming this file."""
    try:
        return check(*args, **kwargs)
    except VeronicaError as exc:
        raise ManifestError(path, exc.field, exc.message) from None


def _setting(path: Path, key: str, value: object) -> object:
    kind = SPACE_SETTINGS.get(key)
    field_name = f"settings.{key}"
    if kind is None:
        raise ManifestError(path, field_name, f"unknown setting (known: {', '.join(sorted(SPACE_SETTINGS))})")
    numeric = (int, float) if kind is float else kind
    if not isinstance(value, numeric) or (kind is not bool and isinstance(value, bool)):
        raise ManifestError(path, field_name, f"must be {kind.__name__}")
    if key in SETTING_RANGES:
        low, high = SETTING_RANGES[key]
        if not low <= value <= high:
            raise ManifestError(path, field_name, f"is {value}; it must be from {low} to {high}")
    if key == "default_permission_mode" and value not in PermissionMode.values:
        raise ManifestError(path, field_name, f"'{value}' must be one of {', '.join(PermissionMode.values)}")
    if key == "webhook_secret" and len(value) > column_limit(Space, "webhook_secret"):
        raise ManifestError(path, field_name, f"is {len(value)} characters; the limit is {column_limit(Space, 'webhook_secret')}")
    return value


def _skill(path: Path) -> tuple[str, str]:
    """A skill file: optional '---\\ndescription: ...\\n---' front matter, then markdown."""
    text = _text_file(path)
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
    limit = column_limit(Skill, "description")
    if len(description) > limit:
        raise ManifestError(path, "description", f"is {len(description)} characters; the limit is {limit}")
    if len(text.strip()) > MAX_SKILL_BODY:
        raise ManifestError(path, "body", f"is {len(text.strip())} characters; the limit is {MAX_SKILL_BODY}")
    return description, text.strip()


def _skills(folder: Path) -> dict[str, tuple[str, str]]:
    """Skills by name: the file stem, lowercased as the skills verb does; two files whose names
    differ only by case would collapse into one, so they are refused."""
    if not folder.is_dir():
        return {}
    found: dict[str, tuple[str, str]] = {}
    files: dict[str, str] = {}
    for path in sorted(folder.glob("*.md")):
        name, skill = _skill_file(path)
        if name in found:
            raise ManifestError(path, "name", f"'{name}' is also the skill in {files[name]}; skill names ignore case")
        found[name], files[name] = skill, path.name
    return found


def _skill_file(path: Path) -> tuple[str, tuple[str, str]]:
    name = path.stem.lower()
    if text_problem(name) or not SKILL_NAME_RE.match(name):
        raise ManifestError(path, "name", f"skill file names are lowercase letters, digits, '-' or '_' "
                                          f"(at most {column_limit(Skill, 'name')} characters) plus '.md'")
    return name, _skill(path)


def _member(folder: Path) -> MemberSpec:
    cfg_path = folder / "member.toml"
    name = _checked(folder, supervisor.check_name, folder.name)
    cfg = _toml(cfg_path)
    unknown = set(cfg) - MEMBER_KEYS
    if unknown:
        raise ManifestError(cfg_path, sorted(unknown)[0], f"unknown key (known: {', '.join(sorted(MEMBER_KEYS))})")
    role = cfg.get("role", Role.WORKER)
    if role not in Role.values:
        raise ManifestError(cfg_path, "role", f"must be one of {', '.join(Role.values)}")
    model = cfg.get("model", "offline")
    try:
        model = validate_model_spec(model)
        if not isinstance(cfg.get("fallback", []), list):
            raise VeronicaError("must be a list of model specs, e.g. [\"openai:gpt-4o\"]", field="fallback")
        fallback = validate_fallback(cfg.get("fallback", []), model)
        schedule = supervisor.validate_cron(cfg["schedule"]) if cfg.get("schedule") else ""
    except VeronicaError as exc:
        raise ManifestError(cfg_path, exc.field, exc.message) from None
    mode = cfg.get("permission_mode", "")
    if mode and mode not in PermissionMode.values:
        raise ManifestError(cfg_path, "permission_mode", f"must be one of {', '.join(PermissionMode.values)}")
    domains = cfg.get("rule_domains", [])
    if not isinstance(domains, list) or not all(isinstance(d, str) for d in domains):
        raise ManifestError(cfg_path, "rule_domains", "must be a list of strings")
    domains = _rule_domains(cfg_path, domains)
    budget = cfg.get("budget")
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or not -INT_MAX <= budget <= INT_MAX):
        raise ManifestError(cfg_path, "budget", f"must be an integer from -{INT_MAX} to {INT_MAX} (>0 caps, <0 unlimited)")
    iterations = cfg.get("max_iterations", 24)
    if not isinstance(iterations, int) or isinstance(iterations, bool) or not 1 <= iterations <= 200:
        raise ManifestError(cfg_path, "max_iterations", "must be an integer from 1 to 200")
    when_to_use = _string(cfg_path, cfg, "when_to_use", max_len=supervisor.MAX_WHEN_TO_USE).strip()
    tools, deferred = _checked(cfg_path, supervisor.check_tools, role, cfg.get("tools"), cfg.get("deferred_tools"))
    persona_path = folder / "persona.md"
    if not persona_path.is_file():
        raise ManifestError(persona_path, "file", "missing: every member needs a persona.md")
    persona = _text_file(persona_path, "persona").strip()
    if len(persona) > supervisor.MAX_PERSONA:
        raise ManifestError(persona_path, "persona", f"is {len(persona)} characters; the limit is {supervisor.MAX_PERSONA}")
    return MemberSpec(name=name, role=role, model=model, persona=persona, when_to_use=when_to_use, schedule=schedule,
                      permission_mode=mode, rule_domains=domains, budget=budget, max_iterations=iterations,
                      skills=_skills(folder / "skills"), mcp_servers=_checked(cfg_path, mcp_servers.check_list, cfg.get("mcp_servers", [])),
                      tools=tools, deferred_tools=deferred, fallback=fallback)


def _rule_domains(cfg_path: Path, domains: list[str]) -> list[str]:
    """Domain names are this space's own (two spaces from one manifest never share one)."""
    try:
        return supervisor.check_domains(domains)
    except VeronicaError as exc:
        raise ManifestError(cfg_path, "rule_domains", exc.message.removeprefix("rule_domains: ")) from None


def _ops_settings(space_path: Path, cfg: dict) -> dict:
    """`verify_checks` (an array of {name, command, timeout} tables) and the `[notify]` table. Only
    what the manifest states is applied, so a notifier an owner set in the console survives a register
    of a manifest that has none."""
    from veronica.ops import notify
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


def _rules(folder: Path) -> dict[str, list[str]]:
    """User rules by domain: rules/<domain>.toml holds `rules = [...]`, this space's own domain.
    Global domains are staff's, never a manifest's."""
    return dict(_rule_file(path) for path in _rule_paths(folder))


def _rule_paths(folder: Path) -> list[Path]:
    return [p for p in sorted(folder.iterdir()) if not (p.name.startswith(".") and p.is_file())] if folder.is_dir() else []


def _rule_file(path: Path) -> tuple[str, list[str]]:
    from learning import api as learning
    from learning.store import clean_rule_text

    if not path.is_file() or not path.name.endswith(".toml"):
        raise ManifestError(path, "file", "rules/ holds only <domain>.toml files")
    try:
        is_global, name = learning.clean_ref(path.name.removesuffix(".toml"))
    except learning.RuleInputError as exc:
        raise ManifestError(path, "domain", exc.message) from None
    if is_global or name != path.name.removesuffix(".toml"):
        raise ManifestError(path, "domain", "the file name is one of this space's own domains, lowercase")
    cfg = _toml(path)
    if set(cfg) - {"rules"}:
        raise ManifestError(path, sorted(set(cfg) - {"rules"})[0], "unknown key (known: rules)")
    texts = cfg.get("rules", [])
    if not isinstance(texts, list) or len(texts) > learning.MAX_ACTIVE_RULES_PER_DOMAIN:
        raise ManifestError(path, "rules", f"must be a list of at most {learning.MAX_ACTIVE_RULES_PER_DOMAIN} strings")
    clean = []
    for i, text in enumerate(texts):
        try:
            clean.append(clean_rule_text(text))
        except learning.RuleInputError as exc:
            raise ManifestError(path, f"rules[{i}]", exc.message) from None
    return name, clean


def check_space_name(value: object, field_name: str = "name") -> str:
    """A space's display name: text, not blank, storable, within the column."""
    limit = column_limit(Space, "name")
    if not isinstance(value, str) or not value.strip():
        raise VeronicaError(f"required, a non-empty string (at most {limit} characters)", field=field_name)
    if text_problem(value):
        raise VeronicaError(text_problem(value), field=field_name)
    if len(value) > limit:
        raise VeronicaError(f"is {len(value)} characters; the limit is {limit}", field=field_name)
    return value.strip()


def _workdir(space_path: Path, cfg: dict, root: Path, *, own: bool, chosen: str | Path | None) -> Path:
    """Where the space's files live. `own`: the space's own folder on the server (archives, templates,
    the console): the manifest may only say 'workspace'. `chosen`: a folder an admin named on the
    command line (`register DIR --workdir PATH`). Otherwise a folder inside the manifest folder,
    never the folder itself, `..`, an absolute path or a link out of it; register makes it if missing."""
    limit = column_limit(Space, "workdir")
    value = _string(space_path, cfg, "workdir", max_len=limit, default=OWN_WORKDIR)
    if own:
        if Path(value) != Path(OWN_WORKDIR):
            raise ManifestError(space_path, "workdir", f"'{value}' is refused: a space made from an archive or a template "
                                                       f"works in its own folder on the server; leave workdir out "
                                                       f"(or set it to '{OWN_WORKDIR}')")
        workdir = root / OWN_WORKDIR
        if workdir.is_symlink() or (workdir.exists() and not workdir.is_dir()):
            raise ManifestError(space_path, "workdir", f"'{OWN_WORKDIR}' must be a folder")
    elif chosen is not None:
        workdir = Path(chosen).resolve()
        if not workdir.is_dir():
            raise ManifestError(space_path, "workdir", f"{workdir} (--workdir) is not a folder")
    else:
        workdir = (root / value).resolve()
        if Path(value).is_absolute() or ".." in Path(value).parts or workdir == root or not workdir.is_relative_to(root):
            raise ManifestError(space_path, "workdir", f"'{value}' must be a folder inside the manifest folder (like "
                                                       f"'{OWN_WORKDIR}'); an admin points a space elsewhere with "
                                                       f"`manage.py register DIR --workdir PATH`")
        if workdir.exists() and not workdir.is_dir():
            raise ManifestError(space_path, "workdir", f"{workdir} is not a folder")
    for folder in (workdir, root):
        if len(str(folder)) > limit:
            raise ManifestError(space_path, "workdir", f"{folder} is longer than {limit} characters")
    return workdir


def load(directory: str | Path, *, slug: str | None = None, name: str | None = None, own: bool = False,
         workdir: str | Path | None = None) -> SpaceSpec:
    """`slug` and `name` override space.toml's (an imported archive registers under the slug and name
    its creator chose); `own` and `workdir` decide where its files live (see _workdir)."""
    root = _root_folder(directory, own=own)
    head = _space_file(root, slug=slug, name=name, own=own, workdir=workdir)
    members = [_member(d) for d in _member_dirs(root)]
    _one_leader(root, members)
    return SpaceSpec(**head, members=members, shared_skills=_skills(root / "skills"), path=root, rules=_rules(root / "rules"))


def _root_folder(directory: str | Path, *, own: bool = False) -> Path:
    root = Path(directory).resolve()
    if not root.is_dir():
        raise ManifestError(root, "directory", "not a folder")
    if not own and root.is_relative_to(TEMPLATES_DIR.resolve()):  # a space run there once left its files in every copy
        raise ManifestError(root, "directory", "a bundled template is never registered in place: create a space from "
                                               "it (New space, or `manage.py register --template NAME --slug SLUG`)")
    return root


def _space_file(root: Path, *, slug: str | None, name: str | None, own: bool, workdir: str | Path | None) -> dict:
    """space.toml: name, slug, workdir, settings and the space's MCP servers."""
    space_path = root / "space.toml"
    cfg = _toml(space_path)
    unknown = set(cfg) - SPACE_KEYS
    if unknown:
        raise ManifestError(space_path, sorted(unknown)[0], f"unknown key (known: {', '.join(sorted(SPACE_KEYS))})")
    name = _checked(space_path, check_space_name, cfg.get("name")) if name is None else check_space_name(name)
    slug = slug or cfg.get("slug") or slugify(name)
    slug_limit = column_limit(Space, "slug")
    if not isinstance(slug, str) or not slug or slug != slugify(slug) or len(slug) > slug_limit:
        raise ManifestError(space_path, "slug", f"lowercase letters, digits and '-' only, 1 to {slug_limit} characters")
    workdir = _workdir(space_path, cfg, root, own=own, chosen=workdir)
    settings = cfg.get("settings", {})
    if not isinstance(settings, dict):
        raise ManifestError(space_path, "settings", "must be a table ([settings])")
    for key, value in settings.items():
        _setting(space_path, key, value)
    settings = {**settings, **_ops_settings(space_path, cfg)}
    servers = _checked(space_path, mcp_servers.check_list, cfg.get("mcp_servers", []))
    a2a = _checked(space_path, a2a_settings.check_manifest_table, cfg["a2a"]) if "a2a" in cfg else None
    return {"name": name, "slug": slug, "workdir": workdir, "settings": settings, "mcp_servers": servers, "a2a": a2a}


def _member_dirs(root: Path) -> list[Path]:
    members_dir = root / "members"
    return [d for d in sorted(members_dir.iterdir()) if d.is_dir()] if members_dir.is_dir() else []


def _one_leader(root: Path, members: list[MemberSpec]) -> None:
    leaders = [m.name for m in members if m.role == Role.LEADER]
    if len(leaders) != 1:
        raise ManifestError(root / "members", "role", f"a space needs exactly one leader; found {len(leaders)} ({', '.join(leaders) or 'none'})")


@dataclass
class Preflight:
    """What `doctor` learns from a manifest without writing anything."""
    errors: list[ManifestError]
    members: list[MemberSpec]
    slug: str = ""


def check(directory: str | Path, *, slug: str | None = None, own: bool = False) -> Preflight:
    """Every file's first error, where load() stops at the first of all: space.toml, each member's
    folder, each shared or member skill file, each rules file, then the one-leader rule. `own` as
    in load(): an archive becomes a space in its own folder."""
    errors: list[ManifestError] = []

    def first(parse, *args, **kwargs):
        try:
            return parse(*args, **kwargs)
        except ManifestError as exc:
            if exc.message not in {e.message for e in errors}:  # a member's skill file is read twice
                errors.append(exc)
            return None

    root = first(_root_folder, directory, own=own)
    if root is None:
        return Preflight(errors, [])
    head = first(_space_file, root, slug=slug, name=None, own=own, workdir=None) or {}
    members, broken = [], 0
    for folder in _member_dirs(root):
        member = first(_member, folder)
        members += [member] if member else []
        broken += member is None
        for path in sorted((folder / "skills").glob("*.md")):
            first(_skill_file, path)
    if not broken:  # with a member unreadable, its role is unknown
        first(_one_leader, root, members)
    skill_files = sorted((root / "skills").glob("*.md"))
    if all([first(_skill_file, path) for path in skill_files]):
        first(_skills, root / "skills")  # names that differ only by case
    for path in _rule_paths(root / "rules"):
        first(_rule_file, path)
    return Preflight(errors, members, head.get("slug", ""))


@dataclass
class Registered:
    """What a register did, for the command's report."""
    space: Space
    mode: str  # "new", "restart" or "fresh"
    kept: list[str] = field(default_factory=list)  # operator changes a restart kept
    discarded: list[str] = field(default_factory=list)  # runtime overrides a fresh register dropped


def register(directory: str | Path, *, fresh: bool = False, actor: str = "register", slug: str | None = None,
             own: bool = False) -> Space:
    return register_space(directory, fresh=fresh, actor=actor, slug=slug, own=own).space


@audit.verb("space.register", space=lambda a, r: r.space, target=lambda a, r: r.space.slug, after=lambda a, r: {"fresh": a["fresh"], "directory": str(a["directory"])})
def register_space(directory: str | Path, *, fresh: bool = False, actor: str = "register", slug: str | None = None,
                   name: str | None = None, own: bool = False, workdir: str | Path | None = None) -> Registered:
    """Create or refresh a space from its manifest (the seed's fresh vs restart semantics).

    restart (default): the manifest's members and fields are applied, but what operators and the
    leader changed at runtime stays: members an operator added or removed, runtime schedules (and
    tombstones), runtime permission modes, live clones, and skills published at runtime.
    fresh: the manifest as written wins; every runtime override is discarded.
    `name` overrides the manifest's; `own` and `workdir` decide where the files live (see _workdir).
    """
    spec = load(directory, slug=slug, name=name, own=own, workdir=workdir)
    spec.workdir.mkdir(parents=True, exist_ok=True)
    with transaction.atomic():
        space, created = Space.objects.get_or_create(slug=spec.slug, defaults={"name": spec.name, "workdir": str(spec.workdir)})
        result = Registered(space=space, mode="new" if created else "fresh" if fresh else "restart")
        space.name, space.workdir, space.manifest_path = spec.name, str(spec.workdir), str(spec.path)
        for key, value in spec.settings.items():
            setattr(space, key, value)
        space.save()
        _apply_members(space, spec, actor, fresh=fresh or created, result=result)
        shared = Skill.objects.filter(space=space, member__isnull=True)
        if fresh:
            result.discarded += [f"shared skill {n} (not in the manifest)" for n in
                                 shared.exclude(name__in=list(spec.shared_skills)).values_list("name", flat=True)]
            shared.delete()
        else:
            result.kept += [f"shared skill {n} (published at runtime)" for n in
                            shared.exclude(name__in=list(spec.shared_skills)).values_list("name", flat=True)]
            shared.filter(name__in=list(spec.shared_skills)).delete()
        for skill_name, (description, body) in spec.shared_skills.items():
            Skill.objects.create(space=space, name=skill_name, description=description, body=body)
        mcp_servers.replace_from_manifest(space, None, spec.mcp_servers, actor=actor)
        _checked(spec.path / "space.toml", a2a_settings.apply_manifest, space, spec.a2a, actor=actor)
        _apply_rules(space, spec, actor)
        events.emit(space.pk, "space.registered", actor=actor, created=created, mode=result.mode,
                    members=[m.name for m in spec.members], kept=result.kept[:50], discarded=result.discarded[:50])
    return result


def _remove(space: Space, member: Member, actor: str, now, reason: str) -> None:
    Member.objects.filter(pk=member.pk).update(removed_at=now, membership=Membership.FROZEN, removed_by=MANIFEST_ACTOR)
    events.emit(space.pk, "member.removed", member=member, actor=actor, reason=reason)


def _apply_members(space: Space, spec: SpaceSpec, actor: str, *, fresh: bool, result: Registered) -> None:
    now = timezone.now()
    wanted = {m.name for m in spec.members}
    live = {m.name: m for m in Member.objects.filter(space=space, removed_at__isnull=True)}
    for name, member in live.items():
        if member.spawned_from_id:  # clones are runtime state
            if fresh:
                _remove(space, member, actor, now, "fresh register: clones are discarded")
                result.discarded.append(f"clone {name}")
            else:
                result.kept.append(f"clone {name}")
        elif name not in wanted:
            if fresh or member.origin == Origin.MANIFEST:
                _remove(space, member, actor, now, "not in manifest")
                if member.origin == Origin.RUNTIME:
                    result.discarded.append(f"member {name} (added at runtime)")
            else:
                result.kept.append(f"member {name} (added at runtime)")
    # a manifest member an operator removed stays removed on a restart
    operator_removed = set() if fresh else set(
        Member.objects.filter(space=space, name__in=wanted - set(live), removed_at__isnull=False, spawned_from__isnull=True)
        .exclude(removed_by=MANIFEST_ACTOR).values_list("name", flat=True))
    for name in sorted(operator_removed):
        result.kept.append(f"member {name} removed at runtime")
    leaders = [m.name for m in spec.members if m.role == Role.LEADER]
    Member.objects.filter(space=space, removed_at__isnull=True, role=Role.LEADER).exclude(name__in=leaders).update(role=Role.WORKER)
    for ms in spec.members:
        if ms.name in operator_removed:
            continue
        member = live.get(ms.name) if ms.name in live and not live[ms.name].spawned_from_id else None
        fields = dict(role=ms.role, model=ms.model, fallback=ms.fallback, persona=ms.persona, when_to_use=ms.when_to_use,
                      rule_domains=ms.rule_domains, budget_override=ms.budget, max_iterations=ms.max_iterations,
                      tools=ms.tools, deferred_tools=ms.deferred_tools, origin=Origin.MANIFEST)
        if member is not None:
            _runtime_edits(member, fields, fresh=fresh, result=result)
        if member is not None and not fresh and member.permission_origin == Origin.RUNTIME:
            result.kept.append(f"{ms.name}: permission mode {member.permission_mode}")
        else:
            if member is not None and member.permission_origin == Origin.RUNTIME:
                result.discarded.append(f"{ms.name}: permission mode {member.permission_mode}")
            fields.update(permission_mode=ms.permission_mode or space.default_permission_mode, permission_origin=Origin.MANIFEST)
        if member is not None and not fresh and member.schedule_origin == Origin.RUNTIME:
            result.kept.append(f"{ms.name}: schedule {'cleared' if member.schedule_tombstone else repr(member.schedule)}")
        else:
            if member is not None and member.schedule_origin == Origin.RUNTIME:
                result.discarded.append(f"{ms.name}: schedule {'cleared' if member.schedule_tombstone else repr(member.schedule)}")
            fields.update(schedule=ms.schedule, schedule_origin=Origin.MANIFEST, schedule_set_at=None, schedule_tombstone=False,
                          schedule_next_at=supervisor.next_fire(ms.schedule) if ms.schedule else None)
        if member is None:
            member = Member.objects.create(space=space, name=ms.name, phase_since=now, **fields)
            events.emit(space.pk, "member.added", member=member, actor=actor, role=ms.role, model=ms.model)
        else:
            Member.objects.filter(pk=member.pk).update(**fields)
        if "schedule_next_at" in fields:
            arm_cron(member.pk, fields["schedule_next_at"])
        skills = Skill.objects.filter(member=member)
        if fresh:
            skills.delete()
        else:
            skills.filter(name__in=list(ms.skills)).delete()
        for skill_name, (description, body) in ms.skills.items():
            Skill.objects.create(space=space, member=member, name=skill_name, description=description, body=body)
        mcp_servers.replace_from_manifest(space, member, ms.mcp_servers, actor=actor)


def _runtime_edits(member: Member, fields: dict, *, fresh: bool, result: Registered) -> None:
    """Fields edited at runtime (supervisor.edit_member) beat the manifest until a fresh register."""
    edited = [f for f in member.runtime_fields or [] if f in fields]
    for name in edited:
        if fresh:
            result.discarded.append(f"{member.name}: {name} (edited at runtime)")
        else:
            result.kept.append(f"{member.name}: {name} (edited at runtime)")
            del fields[name]
    if fresh:
        fields["runtime_fields"] = []


def _apply_rules(space: Space, spec: SpaceSpec, actor: str) -> None:
    """Each domain the manifest has a file for ends with exactly its listed user rules (kept ones
    keep their ids and history); domains without a file are left alone. Through learning's people
    API, so every change is in the rule history."""
    from learning import api as learning
    from learning.models import Rule, RuleSource

    from veronica.swarm.learning_bridge import owner_key

    for name, texts in spec.rules.items():
        domain = learning.domain_for(name, owner_key(space), create=True, actor=actor)
        existing = list(Rule.objects.filter(domain=domain, source=RuleSource.USER).order_by("id"))
        keep = set(texts)
        for rule in existing:
            if rule.text not in keep:
                learning.remove_user_rule(rule.pk, actor=actor)
        have = {rule.text for rule in existing if rule.text in keep}
        for text in texts:
            if text not in have:
                learning.add_user_rule(domain, text, actor=actor)
                have.add(text)
