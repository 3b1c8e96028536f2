"""The command sandbox every command a member can cause runs in: run_command, verify checks and MCP
stdio servers (in the worker and in the web process's Manage › Check).

bubblewrap gives the command the system's /usr read-only, the workspace at /workspace and nothing
else of the host, in new namespaces (user, pid, net, ipc, uts, cgroup). It runs as an unprivileged
uid with no capability, also when the server runs as root: a root with capabilities inside could
remount /usr read-write and write to the host. Every sandboxed process is bounded: processes (a
pids cgroup, or RLIMIT_NPROC when the server is not root: as root that limit does not count),
address space, CPU time and file size (rlimits set by prlimit before bwrap starts), and RAM
filesystems (/tmp and /dev/shm have a size, / and /dev are read-only).

What a command prints is read as it comes and kept as a head and a tail (Capped): a command that
prints gigabytes costs the server a few kilobytes."""
from __future__ import annotations

import os
import re
import selectors
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from veronica.agent.tools.base import ToolError

SANDBOX_ROOT = "/workspace"
SANDBOX_UID = 1000  # inside the user namespace; never 0, and no capability
SIGNAL_EXIT = 128  # bwrap and sh report a command killed by signal N as exit 128 + N
PIDS_V1 = Path("/sys/fs/cgroup/pids")
CGROUP_DIR = "veronica-sandbox"
CHUNK = 65536
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def unconfined() -> bool:
    from django.conf import settings

    return settings.COMMAND_SANDBOX == "none"


@dataclass(frozen=True)
class Limits:
    procs: int
    memory_mb: int
    cpu_seconds: int
    file_mb: int
    tmp_mb: int

    @classmethod
    def from_settings(cls) -> "Limits":
        from django.conf import settings

        return cls(settings.SANDBOX_PROCS, settings.SANDBOX_MEMORY_MB, settings.SANDBOX_CPU_SECONDS, settings.SANDBOX_FILE_MB,
                   settings.SANDBOX_TMP_MB)

    def prlimit(self, nproc: bool) -> list[str]:
        """prlimit's options: the CPU limit's soft side sends SIGXCPU a second before the hard SIGKILL,
        so the exit status says which limit ended the command."""
        mb = 1024 * 1024
        opts = ["--core=0"]
        if self.memory_mb:
            opts.append(f"--as={self.memory_mb * mb}")
        if self.cpu_seconds:
            opts.append(f"--cpu={self.cpu_seconds}:{self.cpu_seconds + 1}")
        if self.file_mb:
            opts.append(f"--fsize={self.file_mb * mb}")
        if nproc and self.procs:
            opts.append(f"--nproc={self.procs}")
        return opts


# --- the process limit: a pids cgroup per command ------------------------------------------------------

def pids_root() -> Path | None:
    """A writable pids cgroup folder for our commands (cgroup v1's pids hierarchy), or None."""
    parent = PIDS_V1
    if not (parent / "cgroup.procs").is_file() or not os.access(parent, os.W_OK):
        return None
    root = parent / CGROUP_DIR
    try:
        root.mkdir(exist_ok=True)
    except OSError:
        return None
    return root


def sweep(root: Path) -> None:
    """Remove the cgroups of commands that ended (rmdir refuses one that still has a process). A
    young one is left alone: its launcher may be between creating it and joining it."""
    settled = time.time() - 60
    for child in root.iterdir():
        try:
            if child.is_dir() and child.stat().st_mtime < settled:
                child.rmdir()
        except OSError:
            pass


# The launcher: a fresh cgroup named after its own pid, the limit, then exec the rest of argv in it,
# so every process the command forks is counted from the first one on.
JOIN = ('cg="$1/$$"; mkdir -p "$cg" && echo "$2" > "$cg/pids.max" && echo $$ > "$cg/cgroup.procs" '
        '|| { echo "veronica: could not join the pids cgroup $cg" >&2; exit 125; }; shift 2; exec "$@"')


def process_bound(limits: Limits) -> tuple[list[str], bool]:
    """(argv prefix that joins a pids cgroup, whether RLIMIT_NPROC must do instead)."""
    if not limits.procs:
        return [], False
    root = pids_root()
    if root is not None:
        sweep(root)
        return ["/bin/sh", "-c", JOIN, "veronica-sandbox", str(root), str(limits.procs)], False
    if os.geteuid() != 0:
        return [], True
    raise ToolError("cannot bound the number of processes of a command: the server runs as root, where RLIMIT_NPROC does "
                    f"not count, and {PIDS_V1} is not writable. Run the server as another user, give it a pids cgroup, or "
                    "set VERONICA_SANDBOX_PROCS=0 to run commands without a process limit")


def cgroup_of(pid: int) -> Path | None:
    root = PIDS_V1 / CGROUP_DIR / str(pid)
    return root if root.is_dir() else None


def hit_process_limit(pid: int) -> bool:
    """The command's cgroup refused a fork (pids.events counts them)."""
    group = cgroup_of(pid)
    try:
        return group is not None and int((group / "pids.events").read_text().split()[-1]) > 0
    except (OSError, ValueError, IndexError):
        return False


def release_cgroup(pid: int) -> None:
    group = cgroup_of(pid)
    if group is not None:
        try:
            group.rmdir()
        except OSError:
            pass  # a straggler still in it; the next sweep removes it


# --- the argv -----------------------------------------------------------------------------------------

# A tenant's variables (secrets marked in_commands, an MCP server's env) are for the command, not for
# the launcher that starts the sandbox on the host (the pids cgroup's /bin/sh, prlimit, bwrap): there
# PATH, LD_PRELOAD, GCONV_PATH and the like would run a file of the workspace (the launcher's cwd)
# on the host, outside bubblewrap. So each crosses the launcher under an inert name and the shell
# inside the sandbox exports it under its own before it runs the command.
CARRIED = "VERONICA_CARRIED_"


def _carried_names(carry: Mapping[str, str]) -> list[tuple[str, str]]:
    return [(name, f"{CARRIED}{i}") for i, name in enumerate(sorted(carry))]


def _shell(command: str, carry: Mapping[str, str]) -> list[str]:
    if not carry:
        return ["/bin/sh", "-c", command]
    exports = ""
    for name, inert in _carried_names(carry):
        if not ENV_NAME.match(name):
            raise ToolError(f"'{name}' is not an environment variable name")
        exports += f'export {name}="${inert}"; unset {inert}; '
    return ["/bin/sh", "-c", exports + 'exec /bin/sh -c "$1"', "sh", command]


def sandboxed(root: Path, command: str, carry: Mapping[str, str] | None = None) -> tuple[list[str], str]:
    """The argv that runs `command` confined to the workspace, and the workspace's path inside.
    `carry`: variables the command gets (the launcher gets them from sandbox_env(home, carry)).

    Without bubblewrap the command refuses to start, unless the operator opts out
    (VERONICA_COMMAND_SANDBOX=none, which also drops the bounds but the output caps)."""
    shell = _shell(command, carry or {})
    if unconfined():
        return shell, str(root)
    bwrap, prlimit = shutil.which("bwrap"), shutil.which("prlimit")
    if bwrap is None or prlimit is None:
        raise ToolError("a sandboxed command needs bubblewrap and prlimit to stay inside the workspace (apt-get install bubblewrap "
                        "util-linux); an operator may set VERONICA_COMMAND_SANDBOX=none to run commands unconfined")
    limits = Limits.from_settings()
    join, nproc = process_bound(limits)
    tmp = str(limits.tmp_mb * 1024 * 1024)
    argv = [*join, prlimit, *limits.prlimit(nproc), "--", bwrap,
            "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
            "--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev",
            "--size", tmp, "--tmpfs", "/dev/shm", "--size", tmp, "--tmpfs", "/tmp",
            "--bind", str(root), SANDBOX_ROOT]
    if Path("/etc/alternatives").is_dir():
        argv += ["--ro-bind", "/etc/alternatives", "/etc/alternatives"]
    # /proc read-only: the sandbox uid is the server's own (root here) outside, and bwrap covers /proc/sys
    # only when its mode says writable, so kernel.core_pattern and every other host sysctl were writable
    argv += ["--remount-ro", "/proc",
             "--remount-ro", "/dev", "--remount-ro", "/",  # bwrap's own tmpfs root and /dev: no unbounded RAM to fill
             "--chdir", SANDBOX_ROOT, "--unshare-all", "--unshare-user", "--disable-userns",
             "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--cap-drop", "ALL", "--new-session", "--die-with-parent"]
    return argv + shell, SANDBOX_ROOT


def sandbox_env(home: str, carry: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment the launcher gets (no host variables), with `carry`'s values under
    inert names: the command inside has them under their own (sandboxed(..., carry))."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8"}
    env.update({inert: (carry or {})[name] for name, inert in _carried_names(carry or {})})
    return env


# --- output, kept as a head and a tail --------------------------------------------------------------

def text_of(data: bytes) -> str:
    """Bytes as tool-result text: bad UTF-8 and NUL (which no database text field takes) as U+FFFD."""
    return data.decode("utf-8", errors="replace").replace("\x00", "\ufffd")


class Capped:
    """The first `head` and last `tail` bytes of a stream; what lies between is counted, not kept."""

    def __init__(self, head: int, tail: int) -> None:
        self.head_cap, self.tail_cap = head, tail
        self.head, self.tail = bytearray(), bytearray()
        self.dropped = 0

    def feed(self, data: bytes) -> None:
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        if len(data) >= self.tail_cap:
            self.dropped += len(self.tail) + len(data) - self.tail_cap
            self.tail = bytearray(data[len(data) - self.tail_cap:])
            return
        self.tail += data
        over = len(self.tail) - self.tail_cap
        if over > 0:
            del self.tail[:over]
            self.dropped += over

    def text(self) -> str:
        if not self.dropped:
            return text_of(bytes(self.head + self.tail))
        marker = f"\n… [truncated: {self.dropped} bytes dropped from the middle] …\n"
        return text_of(bytes(self.head)) + marker + text_of(bytes(self.tail))


@dataclass
class Outcome:
    returncode: int | None  # None: timed out or cancelled
    timed_out: bool
    cancelled: bool
    process_limit: bool  # its cgroup refused a fork


def never() -> bool:
    return False


def run(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float, streams: tuple[Capped, ...],
        cancelled: Callable[[], bool] = never, poll: float = 0.05) -> Outcome:
    """Run argv, feeding stdout (and stderr, when two streams are given; else it joins stdout) into
    `streams` as it comes. A timeout or a cancel kills the whole process group at once."""
    joined = len(streams) == 1
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if joined else subprocess.PIPE, start_new_session=True)
    pipes = [proc.stdout] if joined else [proc.stdout, proc.stderr]
    deadline = time.monotonic() + timeout
    stopped = timed_out = False
    exited_at = None
    with selectors.DefaultSelector() as sel:
        for pipe, sink in zip(pipes, streams):
            sel.register(pipe, selectors.EVENT_READ, sink)
        while sel.get_map():
            for key, _ in sel.select(poll):
                data = os.read(key.fd, CHUNK)
                if data:
                    key.data.feed(data)
                else:
                    sel.unregister(key.fileobj)
            if cancelled():
                stopped = True
                break
            if time.monotonic() > deadline:
                timed_out = True
                break
            if exited_at is None and proc.poll() is not None:
                exited_at = time.monotonic()
            elif exited_at is not None and time.monotonic() - exited_at > 1:
                break  # unconfined: a background process still holds the pipe; the command is over
    kill_group(proc.pid)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    for pipe in pipes:
        pipe.close()
    limit_hit = hit_process_limit(proc.pid)
    release_cgroup(proc.pid)
    code = None if stopped or timed_out else proc.returncode
    return Outcome(code, timed_out, stopped, limit_hit)


def kill_group(pid: int) -> None:
    """SIGKILL the command's process group (bwrap's own kills the sandbox: --die-with-parent, pid ns)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def limit_note(outcome: Outcome, output: str) -> str:
    """A sentence naming the limit that ended the command, or ''."""
    from django.conf import settings

    if unconfined():
        return ""
    code = outcome.returncode
    if outcome.process_limit:
        return (f"command exceeded the {settings.SANDBOX_PROCS} process limit (VERONICA_SANDBOX_PROCS): "
                "a fork was refused")
    if code == SIGNAL_EXIT + signal.SIGXFSZ:
        return f"command exceeded the {settings.SANDBOX_FILE_MB} MB file size limit (VERONICA_SANDBOX_FILE_MB)"
    if code == SIGNAL_EXIT + signal.SIGXCPU:
        return f"command exceeded the {settings.SANDBOX_CPU_SECONDS} s CPU time limit (VERONICA_SANDBOX_CPU_SECONDS)"
    if code and ("Cannot allocate memory" in output or "MemoryError" in output or "out of memory" in output.lower()):
        return (f"the command ran out of memory: each process may use {settings.SANDBOX_MEMORY_MB} MB "
                "(VERONICA_SANDBOX_MEMORY_MB)")
    if code and "No space left on device" in output:
        return f"the command filled a RAM folder: /tmp and /dev/shm hold {settings.SANDBOX_TMP_MB} MB (VERONICA_SANDBOX_TMP_MB)"
    return ""
