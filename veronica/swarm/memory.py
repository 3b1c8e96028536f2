"""Member memory: the durable notes a member keeps across sessions (the seeds' memory dir).

Files are markdown, named like `MEMORY.md` or `project-x.md` (a name without `.md` gets it).
Every write goes through `write`, whoever calls it (the member's memory_write tool, an operator
in the console / API / admin, the learning app's distill), so the caps hold for all of them:
MEMORY_FILE_CHARS per file, MEMORY_TOTAL_CHARS per member, MEMORY_MAX_FILES files. The system
prompt carries an index (name, size, first line), not the contents; memory_read opens a file.
"""
from __future__ import annotations

import re

from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.db.models.functions import Length

from veronica.swarm import audit, events
from veronica.plumbing.compiled_select import fetch
from veronica.plumbing.errors import NotFound, VeronicaError
from veronica.models import Member, MemoryFile

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,76}\.md$")
DESCRIPTION_CHARS = 120


def clean_name(raw: object) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise VeronicaError("name must be a file name such as 'MEMORY.md'", field="name")
    name = raw.strip()
    if not name.lower().endswith(".md"):
        name += ".md"
    if not NAME.match(name) or ".." in name:
        raise VeronicaError(f"name '{raw}' is not allowed: letters, digits, - _ . ; at most 80 characters, ending in .md",
                            field="name")
    return name


def files_of(member: Member | int):
    return MemoryFile.objects.filter(member=member).order_by("name")


def get(member: Member, name: str) -> MemoryFile:
    raw = name.strip() if isinstance(name, str) else ""
    # exact first: files written before names were normalized may lack the .md
    found = files_of(member).filter(name=raw).first() or files_of(member).filter(name=clean_name(name)).first()
    if found is None:
        names = ", ".join(files_of(member).values_list("name", flat=True)) or "none"
        raise NotFound(f"{member.name} has no memory file '{clean_name(name)}'; files: {names}", field="name")
    return found


def description(content: str) -> str:
    """The index line for a file: its first non-empty line, without markdown heading marks."""
    for line in content.splitlines():
        text = line.strip().lstrip("#").strip()
        if text:
            return text if len(text) <= DESCRIPTION_CHARS else text[:DESCRIPTION_CHARS - 1] + "…"
    return "(empty)"


def usage(member: Member, *, excluding: str | None = None) -> tuple[int, int]:
    """(files, characters) the member's memory holds, optionally leaving one file out."""
    qs = files_of(member)
    if excluding:
        qs = qs.exclude(name=excluding)
    agg = qs.aggregate(chars=Sum(Length("content")))
    return qs.count(), agg["chars"] or 0


def _check_caps(member: Member, name: str, content: str) -> None:
    if len(content) > settings.MEMORY_FILE_CHARS:
        raise VeronicaError(f"content is {len(content)} characters; the limit per memory file is {settings.MEMORY_FILE_CHARS}",
                            field="content")
    others, used = usage(member, excluding=name)
    if not files_of(member).filter(name=name).exists() and others + 1 > settings.MEMORY_MAX_FILES:
        raise VeronicaError(f"{member.name} already has {others} memory files; the limit is {settings.MEMORY_MAX_FILES}",
                            field="name")
    if used + len(content) > settings.MEMORY_TOTAL_CHARS:
        raise VeronicaError(f"{member.name}'s memory would hold {used + len(content)} characters; the limit per member is "
                            f"{settings.MEMORY_TOTAL_CHARS} (other files use {used}); shorten or delete a file", field="content")


def check(member: Member, name: str, content: str) -> str:
    """Validate a write without making it (the admin form's clean); returns the clean name."""
    name = clean_name(name)
    _check_caps(member, name, content)
    return name


def _file_row(args: dict, row: MemoryFile) -> dict:
    return {"name": row.name, "chars": len(row.content)}  # the size, not the text: memory is the member's notebook


@audit.verb("memory.write", after=_file_row)
def write(member: Member, name: str, content: object, *, actor: str, append: bool = False) -> MemoryFile:
    """Create or replace (or append to) one file, inside the caps; nothing is written past a cap."""
    name = clean_name(name)
    if not isinstance(content, str):
        raise VeronicaError("content must be a string", field="content")
    with transaction.atomic():
        # lock the member row: two writers must not both pass the total cap
        Member.objects.select_for_update().filter(pk=member.pk).first()
        if append:
            current = files_of(member).filter(name=name).values_list("content", flat=True).first() or ""
            content = (current.rstrip("\n") + "\n\n" + content) if current.strip() else content
        _check_caps(member, name, content)
        row, created = MemoryFile.objects.update_or_create(member=member, name=name, defaults={"content": content})
        events.emit(member.space_id, "memory.written", member=member, name=name, chars=len(content), created=created, by=actor)
    return row


def _fit(title: str, sections: list[str], cap: int) -> str:
    """Title plus the newest sections that fit the file cap (oldest dropped first)."""
    kept = list(sections)
    while True:
        text = "\n\n".join([title, *kept])
        if len(text) <= cap or len(kept) <= 1:
            return text if len(text) <= cap else text[:cap - 1] + "…"
        kept.pop(0)


@audit.verb("memory.append", after=_file_row)
def append_note(member: Member, name: str, note: str, *, title: str, actor: str) -> MemoryFile:
    """A readable, growing notes file: one titled file, one `##` section per note, the oldest
    sections dropped when the file would pass its cap (so a steady stream of notes never fails)."""
    name = clean_name(name)
    section = note.strip()
    if section.startswith("# "):
        section = "#" + section  # the note's own title becomes its section heading
    with transaction.atomic():
        Member.objects.select_for_update().filter(pk=member.pk).first()
        current = files_of(member).filter(name=name).values_list("content", flat=True).first() or ""
        head, *old = re.split(r"\n(?=## )", current.strip()) if current.strip() else [f"# {title}"]
        sections = [s.strip() for s in old if s.strip()] + [section]
        content = _fit(head.strip(), sections, settings.MEMORY_FILE_CHARS)
        _check_caps(member, name, content)
        row, created = MemoryFile.objects.update_or_create(member=member, name=name, defaults={"content": content})
        events.emit(member.space_id, "memory.written", member=member, name=name, chars=len(content), created=created, by=actor)
    return row


@audit.verb("memory.delete")
def delete(member: Member, name: str, *, actor: str) -> str:
    row = get(member, name)
    with transaction.atomic():
        row.delete()
        events.emit(member.space_id, "memory.deleted", member=member, name=row.name, by=actor)
    return row.name


def index(member: Member) -> list[dict]:
    rows = fetch(("memory-files",), lambda s: files_of(s.int("member")), {"member": member.pk})  # compiled once: every run's prompt reads it
    return [{"name": f.name, "chars": len(f.content), "description": description(f.content), "updated_at": f.updated_at}
            for f in rows]


def prompt_block(member: Member, rows: list[dict] | None = None) -> str:
    """The system prompt's memory section: the index and how to use it (contents stay out). rows: the
    index when the caller knows it already (a run whose claim found no memory file: [])."""
    rows = index(member) if rows is None else rows
    used = sum(r["chars"] for r in rows)  # what usage() sums in SQL, from the rows the index read anyway
    lines = ["# Memory",
             "Your memory files persist across sessions. Read one with memory_read before relying on it; keep durable "
             f"facts with memory_write (at most {settings.MEMORY_FILE_CHARS} characters a file, {settings.MEMORY_TOTAL_CHARS} "
             f"in all; you use {used})."]
    if rows:
        lines += [f"- {r['name']} ({r['chars']} chars) — {r['description']}" for r in rows]
    else:
        lines.append("(no memory files yet; MEMORY.md is the usual index of what you keep)")
    return "\n".join(lines)


def limits(member: Member) -> dict:
    files, used = usage(member)
    return {"files": files, "chars": used, "max_files": settings.MEMORY_MAX_FILES,
            "file_chars": settings.MEMORY_FILE_CHARS, "total_chars": settings.MEMORY_TOTAL_CHARS}
