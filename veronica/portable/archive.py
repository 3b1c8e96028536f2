"""Portable spaces: export a space as a manifest archive, create one from a template or an archive.

The archive is the manifest folder `register` reads (see veronica.portable.manifest), as a tar.gz with no
top-level folder and no slug: a space's identity is where it is registered, so exporting a space
registered from another's archive gives the same bytes. Deterministic: sorted entries, mtime 0,
uid/gid 0, no user or group names, gzip without a name or timestamp.

What goes in: the space's name and settings (budgets, ceilings, retention, watchdogs, ...), its verify
checks, its notifier and its MCP servers, its live members (not clones) with persona, model, live
schedule, permission mode, rule domains, budget, iterations and their own MCP servers, their skills
and the shared ones, and the user rules of the space's own learning domains. Secrets are scrubbed
(SECRETS below): the webhook secret, the Slack URL (its path is the credential), a URL's user:password
and query string, MCP env values (the names stay, the values are empty: set them after import).
Runtime state stays out: mail, tasks and their check results, blackboard, transcripts, memory files,
usage, learned rules, workspace files (the archive carries an empty workspace/ folder). Other
features add what they own by appending to EXPORTERS: a function (space) -> {archive path: text}.
"""
from __future__ import annotations

import gzip
import io
import shutil
import tarfile
import tempfile
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Callable

from django.conf import settings
from django.db import transaction
from django.utils.text import slugify

from veronica.swarm import a2a_settings, access, audit
from veronica.portable import manifest, toml_out
from veronica.ops.outbound import scrub_url
from veronica.plumbing.errors import Conflict, VeronicaError, column_limit
from veronica.models import McpServer, McpTransport, Member, Skill, Space

MAX_ARCHIVE_BYTES = 5 * 1024 * 1024  # an upload, compressed
MAX_UNPACKED_BYTES = 20 * 1024 * 1024  # what it may expand to
MAX_ENTRIES = 2000
MAX_HEADER_BYTES = 64 * 1024  # one GNU long-name or PAX header: tarfile reads it whole, before our size check
MAX_HEADER_TOTAL = 1024 * 1024  # all of them in one archive (PAX global headers accumulate)
MAX_HEADER_CHAIN = 8  # extended headers in a row (tarfile recurses once per header)
TEMPLATE_STARTER = "starter"  # a template's starting files (its workspace/ would be a live folder)
SCRUBBED_SETTINGS = {"webhook_secret"}  # secrets never leave the space

Exporter = Callable[[Space], dict[str, str]]


# --- export -----------------------------------------------------------------------------------------------

def _toml(data: dict) -> str:
    return toml_out.dumps(data)


def _mcp_entries(servers) -> list[dict]:
    """[[mcp_servers]] as the manifest declares them; env values are secrets, so only their names go."""
    out = []
    for server in servers:
        entry: dict = {"name": server.name}
        if server.transport == McpTransport.STDIO:
            entry["command"] = list(server.command)
        else:
            entry["url"] = scrub_url(server.url)
        if server.env:
            entry["env"] = {key: "" for key in sorted(server.env)}
        entry["timeout"] = server.timeout
        out.append(entry)
    return out


def _notify_table(space: Space) -> dict:
    table: dict = {}
    if space.notify_webhook_url:
        table["webhook_url"] = scrub_url(space.notify_webhook_url)
    emails = [e for e in space.notify_emails.replace(",", " ").split() if e]
    if emails:
        table["email"] = emails
    return table  # the Slack URL is its own credential: never exported


def _setting_value(key: str, value: object) -> object:
    kind = manifest.SPACE_SETTINGS[key]
    return float(value) if kind is float else kind(value)


def _space_files(space: Space) -> dict[str, str]:
    cfg = {"name": space.name.strip(), "workdir": "workspace",
           "settings": {key: _setting_value(key, getattr(space, key)) for key in sorted(manifest.SPACE_SETTINGS)
                        if key not in SCRUBBED_SETTINGS}}
    notify = _notify_table(space)
    if notify:
        cfg["notify"] = notify
    if space.verify_checks:
        cfg["verify_checks"] = [{"name": c["name"], "command": c["command"], "timeout": c["timeout"]} for c in space.verify_checks]
    servers = _mcp_entries(McpServer.objects.filter(space=space, member__isnull=True).order_by("name"))
    if servers:
        cfg["mcp_servers"] = servers
    a2a = a2a_settings.export_table(space)  # credentials never, remote tokens scrubbed
    if a2a:
        cfg["a2a"] = a2a
    return {"space.toml": _toml(cfg)}


def _skill_text(skill: Skill) -> str:
    # front matter whenever the body itself opens with '---', or the loader would read it as such
    # the loader strips values and reads one line per key: write what it will read back
    description = " ".join(skill.description.splitlines()).strip()
    needs_head = description or skill.body.strip().startswith("---")
    head = f"---\ndescription: {description}\n---\n" if needs_head else ""
    return f"{head}{skill.body.strip()}\n"


def _member_files(space: Space) -> dict[str, str]:
    files: dict[str, str] = {}
    members = Member.objects.filter(space=space, removed_at__isnull=True, spawned_from__isnull=True).order_by("name")
    skills, servers_of = defaultdict(list), defaultdict(list)  # one query each, not one per member
    for skill in Skill.objects.filter(space=space).order_by("name"):
        skills[skill.member_id].append(skill)
    for server in McpServer.objects.filter(space=space, member__isnull=False).order_by("name"):
        servers_of[server.member_id].append(server)
    for m in members:
        cfg = {"role": m.role, "model": m.model, "permission_mode": m.permission_mode, "max_iterations": m.max_iterations,
               "rule_domains": list(m.rule_domains or [])}
        if m.when_to_use.strip():
            cfg["when_to_use"] = m.when_to_use.strip()
        if m.fallback:
            cfg["fallback"] = list(m.fallback)
        if m.schedule:
            cfg["schedule"] = m.schedule
        if m.budget_override is not None:
            cfg["budget"] = m.budget_override
        if m.tools is not None:
            cfg["tools"] = list(m.tools)
        if m.deferred_tools:
            cfg["deferred_tools"] = list(m.deferred_tools)
        servers = _mcp_entries(servers_of[m.pk])
        if servers:
            cfg["mcp_servers"] = servers
        folder = f"members/{m.name}"
        files[f"{folder}/member.toml"] = _toml(cfg)
        files[f"{folder}/persona.md"] = m.persona.strip() + "\n"
        for skill in skills[m.pk]:
            files[f"{folder}/skills/{skill.name}.md"] = _skill_text(skill)
    for skill in skills[None]:
        files[f"skills/{skill.name}.md"] = _skill_text(skill)
    return files


def _rule_files(space: Space) -> dict[str, str]:
    """The user rules of the space's own domains (learned rules are runtime state: they re-learn)."""
    from learning.models import Domain, Rule, RuleSource

    from veronica.swarm.learning_bridge import owner_key

    files: dict[str, str] = {}
    for domain in Domain.objects.filter(owner=owner_key(space), is_global=False).order_by("name"):
        texts = list(dict.fromkeys(Rule.objects.filter(domain=domain, source=RuleSource.USER).order_by("id")
                                   .values_list("text", flat=True)))
        if texts:
            files[f"rules/{domain.name}.toml"] = _toml({"rules": texts})
    return files


EXPORTERS: list[Exporter] = [_space_files, _member_files, _rule_files]


def export_files(space: Space) -> dict[str, str]:
    files: dict[str, str] = {}
    for exporter in EXPORTERS:
        files.update(exporter(space))
    return files


def _tarinfo(name: str, *, size: int = 0, folder: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    info.type = tarfile.DIRTYPE if folder else tarfile.REGTYPE
    info.mode = 0o755 if folder else 0o644
    info.size = size
    return info


@audit.verb("space.export", after=lambda a, data: {"bytes": len(data)})
def export_archive(space: Space) -> bytes:
    """The space as a deterministic .tar.gz (same space, same bytes)."""
    files = export_files(Space.objects.get(pk=space.pk))  # the stored values, not a caller's stale copy
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_tarinfo("workspace", folder=True))
        for name in sorted(files):
            data = files[name].encode("utf-8")
            tar.addfile(_tarinfo(name, size=len(data)), io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def archive_name(space: Space) -> str:
    return f"{space.slug}.tar.gz"


# --- create: from a template or an archive ------------------------------------------------------------------

class ArchiveError(VeronicaError):
    def __init__(self, entry: str, problem: str) -> None:
        super().__init__(f"archive entry {entry!r}: {problem}", field="archive")


def templates() -> dict[str, Path]:
    """The bundled templates: every folder under examples/ with a space.toml."""
    if not manifest.TEMPLATES_DIR.is_dir():
        return {}
    return {d.name: d for d in sorted(manifest.TEMPLATES_DIR.iterdir()) if (d / "space.toml").is_file()}


_EXTENDED = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)


class BoundedTarInfo(tarfile.TarInfo):
    """A header whose payload tarfile would read into memory (long names, PAX records, sparse maps) is
    refused by its declared size before a byte of it is read: 300 kB of gzip made 300 MB otherwise."""

    def _proc_member(self, tar):
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise ArchiveError(self.name, "sparse files are refused")
        if self.type not in _EXTENDED:
            tar.veronica_chain = 0
            return super()._proc_member(tar)
        tar.veronica_chain = getattr(tar, "veronica_chain", 0) + 1
        tar.veronica_header_bytes = getattr(tar, "veronica_header_bytes", 0) + self.size
        if self.size > MAX_HEADER_BYTES:
            raise ArchiveError(self.name, f"an extended header (long name or PAX) of {self.size} bytes; "
                                          f"the limit is {MAX_HEADER_BYTES}")
        if tar.veronica_header_bytes > MAX_HEADER_TOTAL or tar.veronica_chain > MAX_HEADER_CHAIN:
            raise ArchiveError(self.name, f"extended headers (long names or PAX) past {MAX_HEADER_TOTAL} bytes "
                                          f"or {MAX_HEADER_CHAIN} in a row")
        return super()._proc_member(tar)

    def _proc_gnusparse_00(self, *args):  # PAX-declared sparse maps are read whole too
        raise ArchiveError(self.name, "sparse files are refused")

    _proc_gnusparse_01 = _proc_gnusparse_10 = _proc_gnusparse_00


def _unpack(data: bytes, into: Path) -> None:
    """Only plain files and folders with relative names inside `into`; the first bad entry is refused
    by name before anything is written."""
    if len(data) > MAX_ARCHIVE_BYTES:
        raise VeronicaError(f"archive is {len(data)} bytes; the limit is {MAX_ARCHIVE_BYTES}", field="archive")
    try:
        tar = tarfile.open(fileobj=io.BytesIO(data), mode="r:*", tarinfo=BoundedTarInfo)
    except ArchiveError:
        raise
    except (tarfile.TarError, EOFError, OSError, RecursionError) as exc:
        raise VeronicaError(f"archive is not a readable tar or tar.gz ({exc})", field="archive") from None
    with tar:
        checked, total = [], 0
        try:
            for m in tar:  # header by header: a bomb is refused at the entry that crosses the limit
                _check_entry(m)
                total += m.size
                if total > MAX_UNPACKED_BYTES:
                    raise ArchiveError(m.name, f"the archive unpacks to more than {MAX_UNPACKED_BYTES} bytes")
                checked.append(m)
                if len(checked) > MAX_ENTRIES:
                    raise VeronicaError(f"archive has more than {MAX_ENTRIES} entries", field="archive")
        except (tarfile.TarError, EOFError, OSError, zlib.error, RecursionError) as exc:
            raise VeronicaError(f"archive is not a readable tar or tar.gz ({exc})", field="archive") from None
        tar.extractall(into, members=checked, filter="data")  # the stdlib's own guard as a second fence


def _check_entry(m: tarfile.TarInfo) -> None:
    parts = Path(m.name).parts
    if m.name.startswith(("/", "\\")) or Path(m.name).is_absolute() or ".." in parts or "\\" in m.name or ":" in m.name:
        raise ArchiveError(m.name, "absolute names, '..', backslashes and ':' are refused")
    if not (m.isfile() or m.isdir()):
        raise ArchiveError(m.name, "only plain files and folders are allowed (no links or devices)")


def _root(folder: Path) -> Path:
    """An archive may wrap the manifest in one top-level folder."""
    if (folder / "space.toml").is_file():
        return folder
    children = [c for c in folder.iterdir()]
    if len(children) == 1 and children[0].is_dir() and (children[0] / "space.toml").is_file():
        return children[0]
    return folder  # load() names the missing space.toml


def check_slug(slug: str) -> str:
    limit = column_limit(Space, "slug")
    if not isinstance(slug, str) or not slug or slug != slugify(slug) or len(slug) > limit:
        raise VeronicaError(f"lowercase letters, digits and '-' only, 1 to {limit} characters", field="slug")
    if Space.objects.filter(slug=slug).exists():
        raise Conflict(f"a space '{slug}' exists already; pick another slug", field="slug")
    return slug


def may_create(user) -> bool:
    return bool(user and user.is_authenticated and user.is_active and user.has_perm("veronica.add_space"))  # a superuser has it; is_staff alone does not


def home_of(slug: str) -> Path:
    """A space's own folder, decided by the server: its manifest copy, and its files under workspace/."""
    return Path(settings.DATA_DIR) / "spaces" / slug


def _copy_into(source: Path, home: Path, starter: Path | None) -> None:
    """The manifest files, then the workspace's starting files: the template's pristine `starter/`, or
    the archive's own workspace/ (never a template's workspace/, which a space may once have run in)."""
    skip = {manifest.OWN_WORKDIR, TEMPLATE_STARTER} if starter is not None else set()
    shutil.copytree(source, home, symlinks=False, ignore=lambda folder, names: skip & set(names) if folder == str(source) else ())
    workspace = home / manifest.OWN_WORKDIR
    if starter is not None and starter.is_dir():
        shutil.copytree(starter, workspace, symlinks=False)
    workspace.mkdir(exist_ok=True)


def _pin(home: Path, slug: str, name: str | None) -> None:
    """The copy's space.toml says what the server decided (slug, name, no workdir), so an admin's
    `register` of this folder refreshes this very space, in its own folder."""
    import tomllib

    path = home / "space.toml"
    cfg = tomllib.loads(path.read_text(encoding="utf-8"))
    cfg.pop("workdir", None)
    cfg = {"name": name or cfg["name"], "slug": slug, **{k: v for k, v in cfg.items() if k not in ("name", "slug")}}
    path.write_text(_toml(cfg), encoding="utf-8")


@audit.verb("space.import", created=True, target=lambda a, r: r.slug, after=lambda a, r: {"slug": r.slug, "from": "folder"})
def create_from_folder(source: Path, slug: str, *, name: str | None = None, user=None, actor: str = "register",
                       starter: Path | None = None) -> Space:
    """Validate the manifest, copy it to the space's own folder under the data dir (two spaces from
    one template never share a workspace), register it, make `user` its owner. All or nothing.
    Where the files live is the server's: a manifest's `workdir` other than 'workspace' is refused."""
    slug = check_slug(slug)
    name = manifest.check_space_name(name) if name else None
    manifest.load(source, slug=slug, name=name, own=True)  # every error, with its file and field, before anything is written
    home = home_of(slug)
    if home.exists():
        raise Conflict(f"the folder of a space '{slug}' exists already on the server; pick another slug", field="slug")
    home.parent.mkdir(parents=True, exist_ok=True)
    try:
        _copy_into(source, home, starter)
        _pin(home, slug, name)
        with transaction.atomic():
            done = manifest.register_space(home, actor=actor, slug=slug, name=name, own=True)
            if done.mode != "new":  # another request took the slug since check_slug: never merge into it
                raise Conflict(f"a space '{slug}' exists already; pick another slug", field="slug")
            space = done.space
            if user is not None:
                access.grant(space, user.get_username(), access.OWNER, actor=actor)
    except BaseException:
        shutil.rmtree(home, ignore_errors=True)
        raise
    return space


def _template(name: str) -> Path:
    found = templates().get(name)
    if found is None:
        raise VeronicaError(f"no template '{name}' (bundled: {', '.join(templates()) or 'none'})", field="template")
    return found


@audit.verb("space.import", created=True, target=lambda a, r: r.slug, after=lambda a, r: {"slug": r.slug, "from": "template", "template": a["template"]})
def create_from_template(template: str, slug: str, *, name: str | None = None, user=None, actor: str = "register") -> Space:
    found = _template(template)
    return create_from_folder(found, slug, name=name, user=user, actor=actor, starter=found / TEMPLATE_STARTER)


def copy_template(template: str, home: Path, slug: str) -> None:
    """A template's pristine files laid out as a space's own folder, for a space that exists already
    (the demo moving out of the checkout); `register(home, own=True)` then points the space at it."""
    found = _template(template)
    home.parent.mkdir(parents=True, exist_ok=True)
    _copy_into(found, home, found / TEMPLATE_STARTER)
    _pin(home, slug, None)


@audit.verb("space.import", created=True, target=lambda a, r: r.slug, after=lambda a, r: {"slug": r.slug, "from": "archive", "bytes": len(a["data"])})
def create_from_archive(data: bytes, slug: str, *, name: str | None = None, user=None, actor: str = "register") -> Space:
    check_slug(slug)
    with tempfile.TemporaryDirectory(prefix="veronica-import-") as tmp:
        _unpack(data, Path(tmp))
        root = _root(Path(tmp))
        try:
            return create_from_folder(root, slug, name=name, user=user, actor=actor)
        except manifest.ManifestError as exc:
            raise _as_in_archive(exc, root)


def check_archive(data: bytes) -> manifest.Preflight:
    """doctor's preflight of an archive: every file's first error, named as in the archive; the
    archive is unpacked into a temporary folder that is gone afterwards, nothing else is written."""
    with tempfile.TemporaryDirectory(prefix="veronica-doctor-") as tmp:
        _unpack(data, Path(tmp))
        root = _root(Path(tmp))
        found = manifest.check(root, own=True)  # an archive becomes a space in its own folder
    found.errors = [_as_in_archive(exc, root) for exc in found.errors]
    return found


def _as_in_archive(exc: manifest.ManifestError, root: Path) -> manifest.ManifestError:
    """Name the file as it is in the archive, not the temporary folder."""
    exc.message = exc.message.replace(f"{root}/", "").replace(str(root), ".")
    exc.args = (exc.message,)
    return exc
