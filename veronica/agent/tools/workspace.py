"""Workspace tools, confined to the space's folder. File tools never open a path by name: they walk
it from a descriptor of the workdir with no-follow semantics (safe_fs), so a symlink a member plants
(run_command can make any) cannot redirect a read, a write, a listing or a search out of it."""
from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from veronica.agent.tools.base import I, S, Tool, ToolContext, ToolError, arg_int, arg_str, truncate
from veronica.agent.tools.safe_fs import Missing, Place, Refused, Tree, printable, read_regular, shown
from veronica.agent.runctx import stop_requested
from veronica.agent.tools.sandbox import SANDBOX_ROOT, Capped, limit_note, run, sandbox_env, sandboxed, text_of  # noqa: F401 (re-exported)

MAX_READ_BYTES = 200_000
MAX_EDIT_BYTES = 4 * MAX_READ_BYTES  # 200,000 characters are at most this many UTF-8 bytes
MAX_GREP_FILE_BYTES = 10_000_000  # grep skips bigger files rather than load them whole
COMMAND_TIMEOUT_MAX = 30
COMMAND_OUTPUT_CAP = 8000
SKIP_DIRS = {".git", "__pycache__", "node_modules", ".venv"}


def root_of(ctx: ToolContext) -> Path:
    root = Path(ctx.space.workdir).resolve()
    if not root.is_dir():
        raise ToolError(f"the space's workdir {root} does not exist")
    return root


@contextmanager
def workspace(ctx: ToolContext, raw: str) -> Iterator[Tree]:
    """The workdir held open for one call; refusals and OS errors about `raw` become tool errors."""
    from django.conf import settings

    aliases = () if settings.COMMAND_SANDBOX == "none" else (SANDBOX_ROOT,)  # run_command's view of it
    try:
        with Tree(root_of(ctx), aliases) as tree:
            yield tree
    except Refused as exc:
        raise ToolError(str(exc)) from None
    except OSError as exc:
        raise ToolError(f"'{shown(raw)}': {exc.strerror or exc}") from None


def list_dir(ctx: ToolContext, args: dict) -> str:
    raw = arg_str(args, "path", required=False, default=".")
    with workspace(ctx, raw) as tree:
        try:
            place = tree.locate(raw)
        except Missing:
            raise ToolError(f"'{shown(raw)}' is not a directory") from None
        with place:
            if not place.is_dir():
                raise ToolError(f"'{shown(raw)}' is not a directory")
            entries = place.entries()
    lines = []
    for entry in sorted(entries, key=lambda e: (e.kind != "dir", e.name)):
        name = printable(entry.name)
        if entry.name in SKIP_DIRS:
            continue
        if entry.kind == "dir":
            lines.append(f"{name}/")
        elif entry.kind == "file":
            lines.append(f"{name} ({entry.size} bytes)")
        elif entry.kind == "symlink":  # never followed here: its target's size is nobody's business
            lines.append(f"{name} -> {printable(entry.target)} (symlink)")
        else:
            lines.append(f"{name} (not a regular file)")
    return "\n".join(lines) or "(empty directory)"


def read_file(ctx: ToolContext, args: dict) -> str:
    raw = arg_str(args, "path")
    with workspace(ctx, raw) as tree:
        try:
            place = tree.locate(raw)
        except Missing:
            raise ToolError(f"'{shown(raw)}' is not a file") from None
        with place:
            data = place.read(MAX_READ_BYTES)
    if data is None:
        raise ToolError(f"'{shown(raw)}' is not a file")
    text = text_of(data)
    return "\n".join(f"{i:>4}  {line}" for i, line in enumerate(text.splitlines(), 1)) or "(empty file)"


def _files(tree: Tree, place: Place) -> Iterator[tuple[str, int, str]]:
    """(workspace-relative path, directory fd, name) of each regular file at or below `place`."""
    if place.is_dir():
        for parts, dir_fd, name in tree.walk(place, SKIP_DIRS):
            yield "/".join([*parts, name]), dir_fd, name
    elif place.size() is not None:
        yield place.path, place.dir_fd, place.name


def grep(ctx: ToolContext, args: dict) -> str:
    pattern = arg_str(args, "pattern", max_len=500)
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ToolError(f"pattern is not a valid regular expression: {exc}") from None
    raw = arg_str(args, "path", required=False, default=".")
    hits, too_big = [], 0
    with workspace(ctx, raw) as tree:
        try:
            place = tree.locate(raw)
        except Missing:
            return "(no matches)"
        with place:
            for path, dir_fd, name in _files(tree, place):
                try:
                    data = read_regular(dir_fd, name, MAX_GREP_FILE_BYTES + 1)
                except OSError:
                    continue
                if data is None:
                    continue
                if len(data) > MAX_GREP_FILE_BYTES:
                    too_big += 1
                    continue
                for number, line in enumerate(text_of(data).splitlines(), 1):
                    if regex.search(line):
                        hits.append(f"{printable(path)}:{number}: {line.strip()}")
                if len(hits) >= 200:
                    hits.append("… (stopped at 200 matches)")
                    break
    if too_big:
        hits.append(f"(skipped {too_big} files over {MAX_GREP_FILE_BYTES} bytes)")
    return "\n".join(hits) or "(no matches)"


def glob_files(ctx: ToolContext, args: dict) -> str:
    pattern = arg_str(args, "pattern", max_len=300)
    matches = []
    with workspace(ctx, ".") as tree, tree.locate(".") as top:
        for path, _, _ in _files(tree, top):
            if fnmatch.fnmatch(path, pattern):
                matches.append(printable(path))
                if len(matches) >= 500:
                    break
    return "\n".join(matches) or "(no files match)"


def encoded(content: str) -> bytes:
    try:
        return content.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ToolError(f"content is not valid UTF-8 text (character {exc.start})") from None


def write_file(ctx: ToolContext, args: dict) -> str:
    raw = arg_str(args, "path")
    content = arg_str(args, "content", max_len=MAX_READ_BYTES)
    data = encoded(content)
    with workspace(ctx, raw) as tree, tree.locate(raw, create_dirs=True) as place:
        if place.is_dir():
            raise ToolError(f"'{shown(raw)}' is a directory")
        place.write(data)  # atomic: a reader never sees half a file
    return f"wrote {len(content)} characters to {printable(place.path)}"


def edit_file(ctx: ToolContext, args: dict) -> str:
    raw = arg_str(args, "path")
    old, new = arg_str(args, "old"), arg_str(args, "new", max_len=MAX_READ_BYTES)
    with workspace(ctx, raw) as tree:
        try:
            place = tree.locate(raw)
        except Missing:
            raise ToolError(f"'{shown(raw)}' is not a file") from None
        with place:
            data = place.read(MAX_EDIT_BYTES + 1)
            if data is None:
                raise ToolError(f"'{shown(raw)}' is not a file")
            if len(data) > MAX_EDIT_BYTES:
                raise ToolError(f"'{shown(raw)}' is over {MAX_EDIT_BYTES} bytes; edit_file edits files up to that size")
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                raise ToolError(f"'{shown(raw)}' is not UTF-8 text; edit_file only edits text files") from None
            count = text.count(old)
            if count != 1:
                raise ToolError(f"'old' must occur exactly once in {shown(raw)}; it occurs {count} times")
            edited = text.replace(old, new)
            if len(edited) > MAX_READ_BYTES:
                raise ToolError(f"the edited file would be {len(edited)} characters; the limit is {MAX_READ_BYTES}")
            place.write(encoded(edited))  # the same directory descriptor: no second lookup of the path
    return f"edited; wrote {len(edited)} characters to {printable(place.path)}"


def run_command(ctx: ToolContext, args: dict) -> str:
    command = arg_str(args, "command", max_len=2000)
    timeout = arg_int(args, "timeout", default=20, minimum=1, maximum=COMMAND_TIMEOUT_MAX)
    root = root_of(ctx)
    from veronica.swarm import secrets

    carry = secrets.command_env(ctx.member)  # the secrets marked in_commands, by name: the command's, not the launcher's
    argv, home = sandboxed(root, command, carry)
    half = COMMAND_OUTPUT_CAP // 2
    stdout, stderr = Capped(half * 3 // 4, half * 3 // 4), Capped(half // 4, half // 4)
    env = sandbox_env(home, carry)
    outcome = run(argv, cwd=root, env=env, timeout=timeout, streams=(stdout, stderr), cancelled=stop_requested)
    if outcome.cancelled:
        raise ToolError("cancelled: the run was asked to stop (suspended or removed); the command was killed")
    if outcome.timed_out:
        raise ToolError(f"command timed out after {timeout}s")
    err = stderr.text()
    output = (stdout.text() + ("\n[stderr]\n" + err if err else "")).strip()
    note = limit_note(outcome, output)
    if note:
        raise ToolError(f"{note}; exit {outcome.returncode}\n{output}"[:COMMAND_OUTPUT_CAP + 200])
    return truncate(f"exit {outcome.returncode}\n{output}", COMMAND_OUTPUT_CAP + 200)


TOOLS = [
    Tool("list_dir", "List a directory of the workspace.", list_dir, {"path": S}),
    Tool("read_file", "Read a workspace file (with line numbers).", read_file, {"path": S}, ("path",)),
    Tool("grep", "Search workspace files for a regular expression.", grep, {"pattern": S, "path": S}, ("pattern",)),
    Tool("glob", "Find workspace files matching a glob pattern, e.g. '**/*.py'.", glob_files, {"pattern": S}, ("pattern",)),
    Tool("write_file", "Create or replace a workspace file.", write_file, {"path": S, "content": S}, ("path", "content"), mutates=True),
    Tool("edit_file", "Replace one exact occurrence of 'old' with 'new' in a workspace file.", edit_file,
         {"path": S, "old": S, "new": S}, ("path", "old", "new"), mutates=True),
    Tool("run_command", f"Run a shell command in the workspace (timeout ≤ {COMMAND_TIMEOUT_MAX}s, output capped).", run_command,
         {"command": S, "timeout": I}, ("command",), mutates=True),
]
