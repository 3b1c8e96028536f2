"""Workspace tools, confined to the space's folder: every path is resolved (symlinks included)
and refused when it lands outside the workdir."""
from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
from pathlib import Path

from veronica.agent.tools.base import I, S, Tool, ToolContext, ToolError, arg_int, arg_str, truncate

MAX_READ_BYTES = 200_000
COMMAND_TIMEOUT_MAX = 30
COMMAND_OUTPUT_CAP = 8000
SKIP_DIRS = {".git", "__pycache__", "node_modules", ".venv"}


def root_of(ctx: ToolContext) -> Path:
    root = Path(ctx.space.workdir).resolve()
    if not root.is_dir():
        raise ToolError(f"the space's workdir {root} does not exist")
    return root


def confine(ctx: ToolContext, raw: str) -> Path:
    """Resolve a path inside the workdir or refuse it ('..', absolute paths and symlinks alike)."""
    root = root_of(ctx)
    candidate = (root / (raw or ".")).resolve()
    if candidate != root and root not in candidate.parents:
        raise ToolError(f"path '{raw}' is outside the workspace; use a path relative to the workspace root")
    return candidate


def rel(ctx: ToolContext, path: Path) -> str:
    return str(path.relative_to(root_of(ctx))) or "."


def list_dir(ctx: ToolContext, args: dict) -> str:
    path = confine(ctx, arg_str(args, "path", required=False, default="."))
    if not path.is_dir():
        raise ToolError(f"'{arg_str(args, 'path', required=False, default='.')}' is not a directory")
    entries = sorted(path.iterdir(), key=lambda p: (not p.is_dir(), p.name))
    lines = [f"{p.name}/" if p.is_dir() else f"{p.name} ({p.stat().st_size} bytes)" for p in entries if p.name not in SKIP_DIRS]
    return "\n".join(lines) or "(empty directory)"


def read_file(ctx: ToolContext, args: dict) -> str:
    raw = arg_str(args, "path")
    path = confine(ctx, raw)
    if not path.is_file():
        raise ToolError(f"'{raw}' is not a file")
    data = path.read_bytes()[:MAX_READ_BYTES]
    text = data.decode("utf-8", errors="replace")
    return "\n".join(f"{i:>4}  {line}" for i, line in enumerate(text.splitlines(), 1)) or "(empty file)"


def _walk(base: Path):
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            yield Path(dirpath) / name


def grep(ctx: ToolContext, args: dict) -> str:
    pattern = arg_str(args, "pattern", max_len=500)
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ToolError(f"pattern is not a valid regular expression: {exc}") from None
    base = confine(ctx, arg_str(args, "path", required=False, default="."))
    files = [base] if base.is_file() else list(_walk(base))
    hits = []
    for file in files:
        try:
            if file.resolve() != file and root_of(ctx) not in file.resolve().parents:
                continue  # a symlink pointing out of the workspace is not followed
            for number, line in enumerate(file.read_text(errors="replace").splitlines(), 1):
                if regex.search(line):
                    hits.append(f"{rel(ctx, file)}:{number}: {line.strip()}")
        except OSError:
            continue
        if len(hits) >= 200:
            hits.append("… (stopped at 200 matches)")
            break
    return "\n".join(hits) or "(no matches)"


def glob_files(ctx: ToolContext, args: dict) -> str:
    pattern = arg_str(args, "pattern", max_len=300)
    root = root_of(ctx)
    matches = [rel(ctx, p) for p in _walk(root) if fnmatch.fnmatch(rel(ctx, p), pattern)]
    return "\n".join(matches[:500]) or "(no files match)"


def write_file(ctx: ToolContext, args: dict) -> str:
    raw = arg_str(args, "path")
    content = arg_str(args, "content", max_len=MAX_READ_BYTES)
    path = confine(ctx, raw)
    if path.is_dir():
        raise ToolError(f"'{raw}' is a directory")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".veronica-tmp")
    tmp.write_text(content)
    tmp.replace(path)  # atomic: a reader never sees half a file
    return f"wrote {len(content)} characters to {rel(ctx, path)}"


def edit_file(ctx: ToolContext, args: dict) -> str:
    raw = arg_str(args, "path")
    old, new = arg_str(args, "old"), arg_str(args, "new", max_len=MAX_READ_BYTES)
    path = confine(ctx, raw)
    if not path.is_file():
        raise ToolError(f"'{raw}' is not a file")
    text = path.read_text()
    count = text.count(old)
    if count != 1:
        raise ToolError(f"'old' must occur exactly once in {raw}; it occurs {count} times")
    return write_file(ctx, {"path": raw, "content": text.replace(old, new)}).replace("wrote", "edited; wrote")


SANDBOX_ROOT = "/workspace"


def sandboxed(root: Path, command: str) -> tuple[list[str], str]:
    """The argv that runs `command` confined to the workspace, and the workspace's path inside.

    With bubblewrap the command sees only the system's /usr (read-only), a private /tmp and the
    workspace mounted at /workspace; no network, no other space's folder, no host files. Without a
    sandbox the tool refuses, unless the operator opts out (VERONICA_COMMAND_SANDBOX=none)."""
    from django.conf import settings

    if settings.COMMAND_SANDBOX == "none":
        return ["/bin/sh", "-c", command], str(root)
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise ToolError("run_command needs bubblewrap to stay inside the workspace (apt-get install bubblewrap); "
                        "an operator may set VERONICA_COMMAND_SANDBOX=none to run commands unconfined")
    argv = [bwrap, "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
            "--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
            "--bind", str(root), SANDBOX_ROOT, "--chdir", SANDBOX_ROOT, "--unshare-all", "--die-with-parent"]
    if Path("/etc/alternatives").is_dir():
        argv += ["--ro-bind", "/etc/alternatives", "/etc/alternatives"]
    return argv + ["/bin/sh", "-c", command], SANDBOX_ROOT


def run_command(ctx: ToolContext, args: dict) -> str:
    command = arg_str(args, "command", max_len=2000)
    timeout = arg_int(args, "timeout", default=20, minimum=1, maximum=COMMAND_TIMEOUT_MAX)
    root = root_of(ctx)
    argv, home = sandboxed(root, command)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8"}
    try:
        proc = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=timeout,
                              start_new_session=True)
    except subprocess.TimeoutExpired:
        raise ToolError(f"command timed out after {timeout}s") from None
    output = (proc.stdout + ("\n[stderr]\n" + proc.stderr if proc.stderr else "")).strip()
    return truncate(f"exit {proc.returncode}\n{output}", COMMAND_OUTPUT_CAP)


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
