"""A hostile tenant's battery against the SERVED app (daphne + a real qcluster), embedded and hosted.

Four categories, each printed with what was tried and what got through:

1. takeover paths: a non-staff user holding only `veronica.add_space` uploads archives on *New space*
   whose space.toml workdir is "/", "../..", the data folder, another space's workspace, a /proc
   symlink, ... (and one whose workspace entry is a symlink), then tries to read the data folder's
   secret_key, the SQLite file and another space's canary, and to plant a file in the data folder,
   through every door that runs a command or reads files: Manage > Check of an MCP stdio server (web
   process), run_command and read_file called by a model (the mock OpenAI vendor, scripted) in the
   real agent loop (qcluster), and a verify check (qcluster). `register ARCHIVE` is command-line
   only: no tenant reaches it. Counted per (workdir, door): tried / succeeded.
2. sandbox escapes, in each sandboxed door (MCP check, run_command, verify check): uid 0, a
   capability left, remount /usr rw, write to /usr, /etc, outside the workspace, /bin/sh and bwrap
   writable, the host's environment in /proc, PostgreSQL / Redis reachable, unshare and nsenter
   to the host, setuid, ptrace of a privileged parent, mknod. Judged on the host (a file the host
   sees, a marker from the servers' environment), never on the sandbox's word alone.
3. resource exhaustions: processes, a 1.5 GiB allocation, 300 MB into the workspace and into /tmp,
   400 MB of command / check output, 300 MB of MCP stderr, GNU long-name and PAX headers of 300 MB in
   a 300 kB archive, endless commands (and children that try to outlive the timeout). The served
   processes' peak RSS (VmHWM, reset through /proc/PID/clear_refs before each) is measured; contained
   means a clear error or a bounded result and less than 100 MB of growth.
4. bad inputs: a sweep over the JSON API and the console forms a tenant reaches, with the viewer's,
   the operator's and the owner's token or session: oversize strings, NUL, lone surrogates, nesting
   5,000 deep, 5,000-digit integers, negative and out-of-range numbers, wrong types, unknown keys,
   plus hostile archives (blackboard_cap 1-9, deep TOML, huge integers, unknown keys) and a 1 MB login.
   A 5xx is counted; a refused request (4xx) that changed any stored row is a partial write.

Usage: .venv/bin/python bench/attack.py [--modes embedded,hosted] [--quick] [--only takeover,sandbox,exhaust,input]
The last line is one JSON object with the counts per mode. Each mode has its own data folder,
PostgreSQL database, queue name and Redis key prefix (bench/_setup.py), dropped afterwards.
Every file the battery plants on the host is removed; leftover processes it caused are killed by PID.

One file past 500 lines on purpose: the four batteries share one served deployment (its servers, its
users' tokens and sessions, the judge that looks on the host) and one report; split, each part would
re-import the others' set-up, and a reader runs and reads the battery as one script.
"""
from __future__ import annotations

import argparse
import gzip
import html
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MB = 1024 * 1024
RSS_BOUND_KB = 100 * 1024  # "bounded memory": a served process grows by less than this per attack
TAG = uuid.uuid4().hex[:8]
MARKER = f"HOSTMARK{uuid.uuid4().hex[:12]}"  # in the servers' environment only; a sandbox that prints it saw the host


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


# --- served processes -----------------------------------------------------------------------------------------

class Served:
    """daphne and (while needed) a qcluster, in their own sessions, stopped through their PIDs."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env, self.log_dir = env, log_dir
        self.web = self.cluster = None
        self.url = ""

    def start_web(self) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        out = open(self.log_dir / "daphne.log", "ab")
        self.web = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "veronica.asgi:application"],
                                    cwd=REPO, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{port}"
        import requests

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if requests.get(self.url + "/login/", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                time.sleep(0.2)
        raise RuntimeError("daphne did not answer")

    def start_cluster(self) -> None:
        out = open(self.log_dir / "qcluster.log", "ab")
        self.cluster = subprocess.Popen([sys.executable, "manage.py", "qcluster"], cwd=REPO, env={**self.env, "VERONICA_Q_WORKERS": "2"},
                                        stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        time.sleep(3)

    @staticmethod
    def _stop(proc) -> None:
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(5)

    def stop_cluster(self) -> None:
        self._stop(self.cluster)
        self.cluster = None

    def stop(self) -> None:
        self.stop_cluster()
        self._stop(self.web)

    # --- memory: peak RSS of each served process group ---
    def pids(self, which: str) -> list[int]:
        proc = self.web if which == "web" else self.cluster
        if proc is None:
            return []
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(fields[3]) == proc.pid and int(entry.name) not in found:  # session id
                    found.append(int(entry.name))
        return found

    def reset_peaks(self) -> None:
        for which in ("web", "cluster"):
            for pid in self.pids(which):
                try:
                    Path(f"/proc/{pid}/clear_refs").write_text("5")  # 5: reset the peak RSS to the current RSS
                except OSError:
                    pass

    def peaks(self) -> dict[str, dict[int, int]]:
        out: dict[str, dict[int, int]] = {}
        for which in ("web", "cluster"):
            out[which] = {}
            for pid in self.pids(which):
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                except OSError:
                    continue
                hwm = re.search(r"VmHWM:\s+(\d+)", status)
                rss = re.search(r"VmRSS:\s+(\d+)", status)
                if hwm and rss:
                    out[which][pid] = (int(hwm.group(1)), int(rss.group(1)))
        return out


def growth_kb(before: dict, after: dict, which: str) -> int:
    """The largest rise of one process's peak RSS over its RSS when the peaks were reset."""
    grown = 0
    base_default = min((rss for _, rss in before.get(which, {}).values()), default=0)
    for pid, (hwm, _) in after.get(which, {}).items():
        base = before.get(which, {}).get(pid, (0, base_default))[1]
        grown = max(grown, hwm - base)
    return grown


# --- an HTTP user --------------------------------------------------------------------------------------------

class User:
    def __init__(self, base: str, name: str, password: str = "", token: str = "") -> None:
        import requests

        self.base, self.name, self.token = base, name, token
        self.http = requests.Session()
        if password:
            self.http.get(base + "/login/", timeout=10)
            r = self.http.post(base + "/login/", data={"username": name, "password": password, "csrfmiddlewaretoken": self.csrf()},
                               headers={"Referer": base + "/login/"}, allow_redirects=False, timeout=10)
            assert r.status_code == 302, f"login of {name} failed: {r.status_code}"

    def csrf(self) -> str:
        return self.http.cookies.get("csrftoken", "")

    def form(self, path: str, data: dict, files=None, follow: bool = True, timeout: float = 120):
        return self.http.post(self.base + path, data={**data, "csrfmiddlewaretoken": self.csrf()}, files=files,
                              headers={"Referer": self.base + path}, allow_redirects=follow, timeout=timeout)

    def api(self, method: str, path: str, body=None, raw: bytes | None = None, timeout: float = 60):
        import requests

        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        return requests.request(method, self.base + path, data=data, headers=headers, timeout=timeout)


def page_text(response) -> str:
    return html.unescape(response.text)


# --- archives -----------------------------------------------------------------------------------------------

def template_files() -> dict[str, bytes]:
    root = REPO / "examples" / "demo-team"
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def build_archive(files: dict[str, bytes], links: dict[str, str] | None = None, dirs: tuple[str, ...] = ("workspace",)) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for d in dirs:
            if d not in (links or {}):
                info = tarfile.TarInfo(d)
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buf.getvalue()


def with_space_toml(files: dict[str, bytes], edit) -> dict[str, bytes]:
    out = dict(files)
    out["space.toml"] = edit(files["space.toml"].decode()).encode()
    return out


def set_workdir(workdir: str):
    return lambda text: re.sub(r'(?m)^workdir = .*$', "workdir = " + json.dumps(workdir), text)


def _block(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 512)


def giant_header_archive(kind: str, size: int) -> bytes:
    """A gzip'd tar whose first member is a GNU long-name ('L') or PAX ('x') header of `size` bytes:
    a few hundred kB on the wire, `size` bytes for whoever reads the header whole."""
    raw = io.BytesIO()
    gz = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0)
    if kind == "gnu":
        gz.write(_gnu_header(size))
        remaining = size
        chunk = b"a" * MB
        while remaining > 0:
            gz.write(chunk[:min(MB, remaining)])
            remaining -= MB
    else:
        body_len = size
        prefix = f"{body_len} path=".encode()
        # a PAX record "<len> path=<value>\n" whose len counts itself
        value_len = body_len - len(prefix) - 1
        gz.write(_pax_header(body_len))
        gz.write(prefix)
        remaining = value_len
        chunk = b"a" * MB
        while remaining > 0:
            gz.write(chunk[:min(MB, remaining)])
            remaining -= MB
        gz.write(b"\n")
    gz.write(b"\0" * (-size % 512))
    member = tarfile.TarInfo("space.toml")
    member.size = 3
    gz.write(member.tobuf(format=tarfile.USTAR_FORMAT) + _block(b"x=1"))
    gz.write(b"\0" * 1024)
    gz.close()
    return raw.getvalue()


def _gnu_header(size: int) -> bytes:
    info = tarfile.TarInfo("././@LongLink")
    info.type, info.size, info.mode = tarfile.GNUTYPE_LONGNAME, size, 0o644
    return info._create_header(info.get_info(), tarfile.GNU_FORMAT, "utf-8", "surrogateescape")  # noqa: SLF001


def _pax_header(size: int) -> bytes:
    info = tarfile.TarInfo("././@PaxHeader")
    info.type, info.size, info.mode = tarfile.XHDTYPE, size, 0o644
    return info._create_header(info.get_info(), tarfile.USTAR_FORMAT, "ascii", "replace")  # noqa: SLF001


# --- the world --------------------------------------------------------------------------------------------

class World:
    """The referee's view: host paths, canaries, the users, the servers."""

    def __init__(self, mode: str, quick: bool) -> None:
        from django.conf import settings

        self.mode, self.quick = mode, quick
        self.data = Path(settings.DATA_DIR).resolve()
        self.secret = (self.data / "secret_key").read_text().strip()
        self.canary = f"VICTIMCANARY{uuid.uuid4().hex}"
        self.served: Served | None = None
        self.mock = None
        self.users: dict[str, User] = {}
        self.tokens: dict[str, str] = {}

    def setup(self) -> None:
        from django.contrib.auth.models import Permission, User as DjangoUser

        from veronica.swarm import access
        from veronica.portable import archive as portable

        for name in ("tenant", "owner", "operator", "viewer"):
            DjangoUser.objects.create_user(name, password=f"pw-{name}-{TAG}")
        DjangoUser.objects.get(username="tenant").user_permissions.add(Permission.objects.get(codename="add_space"))
        victim = portable.create_from_template("demo-team", "victim", user=DjangoUser.objects.get(username="owner"), actor="bench")
        access.grant(victim, "operator", "operator", actor="bench")
        access.grant(victim, "viewer", "viewer", actor="bench")
        self.victim_ws = Path(victim.workdir).resolve()
        (self.victim_ws / "canary.txt").write_text(self.canary + "\n")
        for name in ("tenant", "owner", "operator", "viewer"):
            _, key = access.create_token(DjangoUser.objects.get(username=name), "bench")
            self.tokens[name] = key

    def targets(self) -> dict[str, tuple[Path, str]]:
        found = {"secret_key": (self.data / "secret_key", self.secret[:24]), "victim_canary": (self.victim_ws / "canary.txt", self.canary)}
        if self.mode == "embedded":
            found["sqlite_file"] = (self.data / "veronica.sqlite3", "SQLite format 3")
        return found

    def login_all(self) -> None:
        for name in ("tenant", "owner", "operator", "viewer"):
            self.users[name] = User(self.served.url, name, password=f"pw-{name}-{TAG}", token=self.tokens[name])

    # --- spaces a tenant makes ---
    def new_space(self, slug: str, archive: bytes | None = None, template: str = "demo-team"):
        user = self.users["tenant"]
        user.http.get(self.served.url + "/new-space/", timeout=10)
        if archive is None:
            return user.form("/new-space/", {"source": "template", "template": template, "slug": slug}, follow=False)
        return user.form("/new-space/", {"source": "archive", "slug": slug}, files={"archive": ("space.tar.gz", archive, "application/gzip")},
                         follow=False)

    def manage(self, slug: str, data: dict, who: str = "tenant"):
        return self.users[who].form(f"/spaces/{slug}/manage/", data)

    def add_mole(self, slug: str) -> None:
        """The tenant adds a member whose model is the (scripted) mock vendor, allowed to run commands."""
        self.manage(slug, {"action": "add_member", "name": "mole", "role": "worker", "model": "openai:gpt-4.1-mini"})
        self.users["tenant"].api("POST", f"/api/spaces/{slug}/members/mole/permission/", {"mode": "bypass"})

    # --- doors ---
    def mcp_door(self, slug: str, name: str, command: str, timeout: int = 20, fail: bool = True) -> str:
        """Manage > Check of a stdio MCP server running `command` (all its output sent to stderr, then
        exit 1 when `fail`); the page's text (the server's stderr tail)."""
        body = f"{{ echo @@S@@; {command}\necho @@E@@; }} 1>&2; exit 1"
        line = shlex.join(["sh", "-c", body if fail else command])
        added = self.manage(slug, {"action": "add_mcp", "name": name, "command": line, "timeout": str(timeout)})
        if added.status_code >= 400:
            return f"[add refused {added.status_code}] " + _messages(page_text(added))
        checked = self.manage(slug, {"action": "check_mcp", "name": name})
        text = f"[check {checked.status_code}] " + _messages(page_text(checked))
        self.manage(slug, {"action": "remove_mcp", "name": name})
        inner = re.search(r"@@S@@(.*?)@@E@@", text, re.S)  # the probe's own output, when the tail kept all of it
        return inner.group(1) if inner else text

    def agent_door(self, slug: str, calls: list[tuple[str, dict]], checks: list[tuple[str, str, int]] = (), wait: float = 150):
        """One run of `mole`: the scripted tool calls (each result returned), then, if `checks` are given,
        a task with verify checks that mole completes, and the checks' outputs."""
        from django.db import close_old_connections

        from tests.vendors import faults as f
        from veronica.swarm import bus, ledger
        from veronica.models import Member, Run, Space, TaskCheck, Turn

        close_old_connections()
        space = Space.objects.get(slug=slug)
        mole = Member.objects.get(space=space, name="mole")
        for name, command, timeout in checks:
            r = self.manage(slug, {"action": "add_check", "name": name, "command": command, "timeout": str(timeout)})
            if r.status_code >= 400:
                log(f"    add_check {name} refused: {_messages(page_text(r))[:200]}")
        last_turn = Turn.objects.filter(session__member=mole).order_by("-pk").values_list("pk", flat=True).first() or 0
        runs_before = Run.objects.filter(member=mole, ended_at__isnull=False).count()
        script = [f.tool_call(name, args) for name, args in calls]
        task = None
        if checks:
            space.refresh_from_db()
            task = ledger.create_task(space, "bench", "attack verify", verify_policy="checks")
            script += [f.tool_call("task_update_status", {"task_id": task.pk, "status": "running"}),
                       f.tool_call("task_done", {"task_id": task.pk, "result": "done"})]
        script.append(f.text("done"))
        self.mock.script.clear()
        self.mock.push(*script)
        if task is not None:
            ledger.assign(task, mole, actor="bench")
        else:
            bus.send(space, "bench", "mole", "go")
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            close_old_connections()
            if not self.mock.script and Run.objects.filter(member=mole, ended_at__isnull=False).count() > runs_before:
                break
            time.sleep(0.3)
        results = list(Turn.objects.filter(session__member=mole, role="tool", pk__gt=last_turn).order_by("pk").values_list("content", flat=True))
        outputs: dict[str, str] = {}
        if task is not None:
            while time.monotonic() < deadline and TaskCheck.objects.filter(task=task).count() < len(checks):
                time.sleep(0.3)
                close_old_connections()
            outputs = {c.name: f"exit {c.exit_code} timed_out {c.timed_out}\n{c.output}" for c in TaskCheck.objects.filter(task=task)}
            for name, _, _ in checks:
                self.manage(slug, {"action": "remove_check", "check": name})
        if time.monotonic() >= deadline:
            log(f"    (agent door on {slug} timed out after {wait}s; script left {len(self.mock.script)})")
        return results, outputs


def _messages(text: str) -> str:
    """The flash messages and errors of a console page, as text."""
    found = re.findall(r'<(?:li|div|p)[^>]*class="[^"]*(?:message|error|alert|flash|msg)[^"]*"[^>]*>(.*?)</(?:li|div|p)>', text, re.S)
    body = " | ".join(re.sub(r"<[^>]+>", "", m).strip() for m in found)
    return body or re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", text))[:3000]


def tagged(outputs: list[str]) -> dict[str, str]:
    """Split tool results on the @@id@@ tags the probe commands echo first."""
    joined = "\n".join(outputs)
    parts = re.split(r"@@([A-Za-z0-9_]+)@@", joined)
    found: dict[str, str] = {}
    for i in range(1, len(parts) - 1, 2):
        found[parts[i]] = found.get(parts[i], "") + parts[i + 1]
    return found


# --- 1. takeover --------------------------------------------------------------------------------------------

def takeover(w: World) -> dict:
    from veronica.models import Space

    files = template_files()
    variants = [
        ("root", "/"), ("dotdot2", "../.."), ("dotdot3", "../../.."), ("datadir_abs", str(w.data)),
        ("victim_rel", "../victim/workspace"), ("victim_abs", str(w.victim_ws)), ("proc_cwd", "/proc/self/cwd"),
        ("proc1_root", "/proc/1/root"), ("etc", "/etc"), ("ws_dotdot", "workspace/../../.."), ("tmp", "/tmp"),
        ("symlink_entry", None),
    ]
    if w.quick:
        variants = [v for v in variants if v[0] in ("root", "dotdot2", "victim_abs", "proc_cwd", "symlink_entry")]
    doors = ("mcp_check", "run_command", "read_file", "verify_check")
    tried = succeeded = accepted_outside = 0
    rows = []
    for label, workdir in variants:
        slug = f"tk-{label.replace('_', '-')}"
        if workdir is None:  # the workspace folder itself is a symlink to /
            archive = build_archive({k: v for k, v in files.items() if not k.startswith("workspace/")}, links={"workspace": "/"}, dirs=())
        else:
            archive = build_archive(with_space_toml(files, set_workdir(workdir)))
        r = w.new_space(slug, archive)
        tried += len(doors)
        space = Space.objects.filter(slug=slug).first()
        if r.status_code != 302 or space is None:
            rows.append((label, f"refused {r.status_code}", _messages(page_text(r))[:160]))
            continue
        ws = Path(space.workdir).resolve()
        home = (w.data / "spaces" / slug).resolve()
        outside = not (ws == home or home in ws.parents)
        accepted_outside += outside
        leaks = door_leaks(w, slug, ws)
        won = [d for d in doors if leaks.get(d)]
        succeeded += len(won)
        dead = f" (DOORS THAT DID NOT RUN: {', '.join(leaks['dead'])})" if leaks.get("dead") else ""
        rows.append((label, f"accepted, workdir {ws}{' (OUTSIDE its folder)' if outside else ''}",
                     ("; ".join(f"{d}: {', '.join(leaks[d])}" for d in won) or "nothing leaked") + dead))
    log("[takeover] (workdir variant: outcome / what each door leaked)")
    for label, outcome, detail in rows:
        log(f"  {label:14} {outcome}  -> {detail}")
    return {"tried": tried, "succeeded": succeeded, "accepted_outside": accepted_outside, "variants": len(variants)}


def door_leaks(w: World, slug: str, ws: Path) -> dict[str, list[str]]:
    """For one tenant space: which targets each door read, and whether a planted file landed in the data folder."""
    targets = w.targets()
    inside = {name: "/workspace/" + os.path.relpath(path, ws) for name, (path, _) in targets.items()}
    relative = {name: os.path.relpath(path, ws) for name, (path, _) in targets.items()}
    # a file planted in the data folder, and one in the app's code folder (hosted: the code others run)
    planted = {door: (w.data / f"pwned-{slug}-{door}", REPO / f".pwned-{slug}-{door}") for door in ("mcp_check", "run_command", "verify_check")}

    def read_cmd(door: str) -> str:
        reads = "; ".join(f"head -c 80 {shlex.quote(p)}; echo" for p in inside.values())
        plants = "; ".join(f"echo pwned > {shlex.quote('/workspace/' + os.path.relpath(path, ws))}" for path in planted[door])
        return f"echo ALIVE-$((6*7)); {reads}; {plants}; true"

    def found(text: str) -> list[str]:
        return [name for name, (_, needle) in targets.items() if needle in text]

    leaks: dict[str, list[str]] = {}
    mcp_out = w.mcp_door(slug, "leak", read_cmd("mcp_check"))
    leaks["mcp_check"] = found(mcp_out)
    w.add_mole(slug)
    calls = [("run_command", {"command": read_cmd("run_command")})] + [("read_file", {"path": p}) for p in relative.values()]
    results, checks = w.agent_door(slug, calls, checks=[("leak", read_cmd("verify_check"), 30)])
    leaks["run_command"] = found(results[0] if results else "")
    leaks["read_file"] = found("\n".join(results[1:1 + len(relative)]))
    leaks["verify_check"] = found("\n".join(checks.values()))
    if os.environ.get("ATTACK_DEBUG"):
        log("    results:", [r[:150] for r in results], "checks:", {k: v[:150] for k, v in checks.items()})
    alive = {"mcp_check": "ALIVE-42" in mcp_out, "run_command": bool(results) and "ALIVE-42" in results[0],
             "read_file": len(results) >= 1 + len(relative), "verify_check": "ALIVE-42" in "\n".join(checks.values())}
    for door, ok in alive.items():
        if not ok:
            leaks.setdefault("dead", []).append(door)
    for door, paths in planted.items():
        for path, where in zip(paths, ("data", "code")):
            if path.exists():
                leaks[door].append(f"planted a file in the {where} folder")
                path.unlink()
    return leaks


# --- 2. sandbox escapes ----------------------------------------------------------------------------------------

def probes(w: World, r: str) -> list[tuple[str, str]]:
    py = "python3 -c"
    return [
        ("control", "echo CONTROL-$((6*7))"),  # not an attack: proves the door ran the command and we read its output
        ("uid0", "id -u"),
        ("capability", "grep CapEff /proc/self/status"),
        ("remount_usr", "mount -o remount,rw,bind /usr 2>&1 && echo REMOUNT-OK"),
        ("write_usr", f"mount -o remount,rw,bind /usr 2>/dev/null; touch /usr/.attack-{r} 2>&1"),
        ("write_etc", f"touch /etc/.attack-{r} 2>&1"),
        ("write_bin_sh", "mount -o remount,rw,bind /usr 2>/dev/null; " + py + " \"import os; print('W-OK' if os.access(os.path.realpath('/bin/sh'), os.W_OK) else 'ro')\""),
        ("write_bwrap", "mount -o remount,rw,bind /usr 2>/dev/null; " + py + " \"import os; print('W-OK' if os.access('/usr/bin/bwrap', os.W_OK) else 'ro')\""),
        ("write_outside_ws", f"touch /workspace/../escape-{r} /workspace/../../escape-{r} /workspace/../../../escape-{r} 2>&1"),
        ("host_environ", f"cat /proc/1/environ /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -m1 {MARKER[:8]}"),
        ("net_postgres", py + " \"import socket; socket.create_connection(('127.0.0.1', 5432), 2); print('CONNECTED')\" 2>&1 | tail -1"),
        ("net_redis", py + " \"import socket; socket.create_connection(('127.0.0.1', 6379), 2); print('CONNECTED')\" 2>&1 | tail -1"),
        ("unshare", f"unshare -U -r -m sh -c 'mount -o remount,rw,bind /usr && touch /usr/.attack-u{r}' 2>&1 | tail -1"),
        ("nsenter", f"nsenter -t 1 -a -- sh -c 'touch {w.data}/nsenter-{r}' 2>&1 | tail -1"),
        ("setuid", "grep NoNewPrivs /proc/self/status; stat -c 'su-owner=%u' /usr/bin/su"),
        ("ptrace_parent", py + " \"import ctypes, os; p = os.getppid(); libc = ctypes.CDLL(None); r = libc.ptrace(16, p, 0, 0); libc.ptrace(17, p, 0, 0); "
                               "c = [l for l in open('/proc/%d/status' % p) if l.startswith('CapEff')]; print('PTRACE', p, r, c[0].split()[1] if c else '?')\" 2>&1"),
        ("mknod", "mknod /tmp/sda b 8 0 2>&1 && echo MKNOD-OK"),
        # a host-wide sysctl: core_pattern opened for writing (never written; "|prog" there runs prog as host root),
        # printk_ratelimit written with the value it already has (no change, but the kernel took the write)
        ("proc_sys_write", "v=$(cat /proc/sys/kernel/printk_ratelimit); echo \"$v\" > /proc/sys/kernel/printk_ratelimit 2>&1 && echo WROTE-SYSCTL; "
                           + py + " \"import os\ntry: os.close(os.open('/proc/sys/kernel/core_pattern', os.O_WRONLY)); print('OPEN-W core_pattern')\n"
                                  "except OSError as e: print('no', e)\""),
    ]


def judge(w: World, name: str, out: str, r: str, ws: Path) -> bool:
    if name == "control":
        return "CONTROL-42" in out
    lines = [line.strip() for line in out.strip().splitlines() if line.strip()]
    host_files = {"write_usr": [Path(f"/usr/.attack-{r}")], "write_etc": [Path(f"/etc/.attack-{r}")],
                  "unshare": [Path(f"/usr/.attack-u{r}")], "nsenter": [w.data / f"nsenter-{r}"],
                  "write_outside_ws": [ws.parent / f"escape-{r}", ws.parent.parent / f"escape-{r}", ws.parent.parent.parent / f"escape-{r}"]}
    if name in host_files:
        hit = False
        for path in host_files[name]:
            if path.exists():
                hit = True
                path.unlink()
        return hit
    if name == "uid0":
        return any(line == "0" for line in lines)
    if name == "capability":
        m = re.search(r"CapEff:\s*([0-9a-f]+)", out)
        return bool(m and int(m.group(1), 16))
    if name == "remount_usr":
        return "REMOUNT-OK" in out
    if name in ("write_bin_sh", "write_bwrap"):
        return "W-OK" in out
    if name == "host_environ":
        return MARKER in out
    if name in ("net_postgres", "net_redis"):
        return "CONNECTED" in out
    if name == "setuid":
        return "NoNewPrivs:\t0" in out.replace("NoNewPrivs: ", "NoNewPrivs:\t") and "su-owner=0" in out
    if name == "ptrace_parent":
        m = re.search(r"PTRACE (\d+) (-?\d+) ([0-9a-f?]+)", out)
        return bool(m and m.group(2) == "0" and m.group(3) not in ("?", "0" * 16))
    if name == "mknod":
        return "MKNOD-OK" in out
    if name == "proc_sys_write":
        return "OPEN-W" in out or "WROTE-SYSCTL" in out
    raise KeyError(name)


def sandbox(w: World) -> dict:
    from veronica.models import Space

    slug = "sbx"
    w.new_space(slug)
    ws = Path(Space.objects.get(slug=slug).workdir).resolve()
    w.add_mole(slug)
    tried = succeeded = 0
    table: dict[str, dict[str, str]] = {}
    # MCP check (web process): one server per probe
    r = uuid.uuid4().hex[:8]
    seen: dict[str, dict[str, str]] = {}

    def record(name: str, door: str, out: str | None, won: bool) -> None:
        nonlocal tried, succeeded
        seen.setdefault(name, {})[door] = re.sub(r"\s+", " ", out or "")[:70]
        if name == "control":
            table.setdefault(name, {})[door] = "door works" if won else "DOOR DEAD (counts below are void)"
            return
        tried, succeeded = tried + 1, succeeded + won
        table.setdefault(name, {})[door] = "ESCAPED" if won else ("held" if out is not None else "no result")

    for name, cmd in probes(w, r):
        out = w.mcp_door(slug, f"p-{name.replace('_', '-')}"[:40], cmd)
        record(name, "mcp_check", out, judge(w, name, out, r, ws))
    # run_command (worker) and verify checks (worker), in one run of mole
    r1, r2 = uuid.uuid4().hex[:8], uuid.uuid4().hex[:8]
    run_probes, check_probes = probes(w, r1), probes(w, r2)
    calls = [("run_command", {"command": f"echo @@{name}@@; {cmd}"}) for name, cmd in run_probes]
    checks = [(f"p-{name.replace('_', '-')}", cmd, 20) for name, cmd in check_probes]
    results, outputs = w.agent_door(slug, calls, checks=checks[:20])  # a space holds at most 20 checks
    by_tag = tagged(results)
    for name, _ in run_probes:
        record(name, "run_command", by_tag.get(name), judge(w, name, by_tag.get(name, ""), r1, ws))
    for name, _ in check_probes:
        out = outputs.get(f"p-{name.replace('_', '-')}")
        record(name, "verify_check", out, judge(w, name, out or "", r2, ws))
    log("[sandbox] probe: mcp_check / run_command / verify_check  (what each door printed)")
    for name, cells in table.items():
        log(f"  {name:17} " + "  ".join(f"{door}={state}" for door, state in cells.items()))
        log("  " + " " * 17 + " | ".join(f"{seen[name].get(door, '')!r}" for door in cells))
    return {"tried": tried, "succeeded": succeeded}


# --- 3. resource exhaustion --------------------------------------------------------------------------------------

def leftovers(tag: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if tag.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def exhaust(w: World) -> dict:
    from veronica.models import Space

    slug = "exh"
    w.new_space(slug)
    ws = Path(Space.objects.get(slug=slug).workdir).resolve()
    w.add_mole(slug)
    rows = []

    def measure(label: str, attack, contained_by) -> None:
        w.served.reset_peaks()
        before = w.served.peaks()
        started = time.monotonic()
        result = attack()
        took = time.monotonic() - started
        after = w.served.peaks()
        web, worker = growth_kb(before, after, "web"), growth_kb(before, after, "cluster")
        ok, why = contained_by(result, took)
        if isinstance(result, str) and "error: argument" in result:  # the battery's own mistake is no containment
            ok, why = False, f"the attack did not run: {result[:120]}"
        bounded = max(web, worker) < RSS_BOUND_KB
        rows.append((label, ok and bounded, f"{why}; {took:.1f}s; peak RSS +{web // 1024} MB web, +{worker // 1024} MB worker"))

    def run(cmd: str, timeout: int = 30) -> str:
        results, _ = w.agent_door(slug, [("run_command", {"command": cmd, "timeout": timeout})], wait=timeout + 90)
        return results[0] if results else "(no tool result)"

    def check(cmd: str, timeout: int = 60) -> str:
        _, outputs = w.agent_door(slug, [], checks=[("x", cmd, timeout)], wait=timeout + 90)
        return outputs.get("x", "(no check result)")

    def first(text: str, n: int = 90) -> str:
        return re.sub(r"\s+", " ", text)[:n]

    # processes
    forks = "i=0; while [ $i -lt 1000 ]; do sleep 15 & i=$((i+1)); done 2>/dev/null; echo procs=$(ls -d /proc/[0-9]* | wc -l)"
    measure("1000 processes (run_command)", lambda: run(forks),
            lambda out, _: ("process limit" in out or ((m := re.search(r"procs=(\d+)", out)) is not None and int(m.group(1)) < 1000), first(out)))
    alloc = "python3 -c \"b = b'x' * (1536 * 1024 * 1024); print('ALLOCATED', len(b))\" 2>&1 | tail -1"
    measure("1.5 GiB allocation (run_command)", lambda: run(alloc), lambda out, _: ("ALLOCATED" not in out, first(out)))
    big = ws / "big.bin"
    measure("300 MB into the workspace", lambda: run("head -c 300M /dev/zero > /workspace/big.bin; echo rc=$?"),
            lambda out, _: ((size := big.stat().st_size if big.exists() else 0) < 300 * MB, f"{size // MB} MB written; {first(out)}"))
    big.unlink(missing_ok=True)
    # the per-file limit is not a quota: five files under it fill the disk just the same
    spread = "for i in 1 2 3 4 5; do head -c 200M /dev/zero > /workspace/fill$i.bin; done; echo rc=$?; du -sm /workspace"
    measure("1 GB in five files into the workspace", lambda: run(spread),
            lambda out, _: ((total := sum(p.stat().st_size for p in ws.glob("fill*.bin"))) < 1000 * MB, f"{total // MB} MB written; {first(out)}"))
    for path in ws.glob("fill*.bin"):
        path.unlink()
    measure("300 MB into /tmp", lambda: run("head -c 300M /dev/zero > /tmp/big.bin; echo rc=$? size=$(stat -c %s /tmp/big.bin)"),
            lambda out, _: ((m := re.search(r"size=(\d+)", out)) is None or int(m.group(1)) < 300 * MB, first(out)))
    flood = "head -c 400M /dev/zero | tr '\\0' a"
    measure("400 MB of output (run_command)", lambda: run(flood), lambda out, _: (len(out) < 100_000, f"{len(out)} characters kept"))
    measure("400 MB of output (verify check)", lambda: check(flood), lambda out, _: (len(out) < 100_000, f"{len(out)} characters kept"))
    measure("300 MB of MCP stderr (Manage > Check)", lambda: w.mcp_door(slug, "flood", "head -c 300M /dev/zero | tr '\\0' a"),
            lambda out, _: (True, first(out)))
    for kind in ("gnu", "pax"):
        archive = giant_header_archive(kind, 300 * MB)
        measure(f"{kind} header of 300 MB in a {len(archive) // 1024} kB archive",
                lambda: w.new_space(f"hdr-{kind}", archive), lambda resp, _: (400 <= resp.status_code < 500, f"HTTP {resp.status_code}"))
    # endless commands: the timeout holds and nothing outlives it
    for label, attack, tag in (
        ("endless run_command (timeout 3 s)", lambda: run("sleep 3141591", timeout=3), "3141591"),
        ("run_command child outliving its timeout", lambda: run("setsid sleep 3141592 & (trap '' TERM; sleep 3141593) ", timeout=3), "314159"),
        ("endless verify check (timeout 3 s)", lambda: check("sleep 3141594", timeout=3), "3141594"),
        ("endless MCP server (timeout 5 s)", lambda: w.mcp_door(slug, "endless", "sleep 3141595", timeout=5, fail=False), "3141595"),
    ):
        def bounded(out: str, took: float, tag=tag) -> tuple[bool, str]:
            time.sleep(2)
            left = leftovers(tag)
            kill_all(left)
            return (not left and took < 60, f"{len(left)} processes left over; {first(out)}")
        measure(label, attack, bounded)
    log("[exhaustion] attack: contained? detail")
    for label, ok, detail in rows:
        log(f"  {label:45} {'contained' if ok else 'NOT CONTAINED'}  {detail}")
    return {"tried": len(rows), "contained": sum(ok for _, ok, _ in rows)}


# --- 4. bad inputs ------------------------------------------------------------------------------------------

VOLATILE = {"last_used_at", "last_login", "updated_at", "checked_at", "heartbeat_at"}


def db_state() -> dict:
    from django.apps import apps
    from django.contrib.auth.models import User as DjangoUser

    state = {"auth.User": [{k: v for k, v in row.items() if k not in VOLATILE} for row in DjangoUser.objects.order_by("pk").values()]}
    for label in ("veronica", "learning", "waggle"):
        for model in apps.get_app_config(label).get_models():
            state[model._meta.label] = [{k: v for k, v in row.items() if k not in VOLATILE} for row in model.objects.order_by("pk").values()]
    from django.conf import settings

    data = Path(settings.DATA_DIR)  # files count too: a refused archive or memory write must leave no folder behind
    state["files"] = sorted(str(p.relative_to(data)) for folder in ("spaces", "workspaces") if (data / folder).is_dir()
                            for p in (data / folder).rglob("*"))
    return state


DEEP = "[" * 5000 + "]" * 5000
HUGE = "9" * 5000
RAW = "@@RAW@@"


def mutations(value) -> list[tuple[str, object]]:
    """(label, replacement) for one field; RAW + text means: splice the text into the JSON as is."""
    out: list[tuple[str, object]] = [
        ("oversize", "x" * 1_000_000), ("nul", "a\x00b"), ("surrogate", "a\ud800"), ("deep", RAW + DEEP), ("huge_int", RAW + HUGE),
        ("neg", -1), ("big", 10 ** 18), ("list", ["a"]), ("dict", {"a": 1}), ("null", None), ("long", "y" * 70_000), ("bool", True),
    ]
    if isinstance(value, int) and not isinstance(value, bool):
        out += [("cap_low", 5), ("neg_huge", RAW + "-" + HUGE), ("str_num", "12")]
    return out


def encode(body: dict, field: str, replacement) -> bytes:
    if isinstance(replacement, str) and replacement.startswith(RAW):
        text = json.dumps({**body, field: "@@SPLICE@@"})
        return text.replace('"@@SPLICE@@"', replacement[len(RAW):]).encode()
    text = json.dumps({**body, field: replacement})  # a lone surrogate goes out as the JSON escape \\ud800
    return text.encode()


def api_cases(victim: str) -> list[tuple[str, str, dict]]:
    S = f"/api/spaces/{victim}"
    M = f"{S}/members/scout"
    return [
        ("POST", "/api/tokens/", {"name": "fz"}),
        ("POST", f"{S}/members/", {"name": "fz", "role": "worker", "persona": "p", "when_to_use": "w", "model": "offline",
                                   "permission_mode": "default", "schedule": "", "rule_domains": ["conduct"]}),
        ("POST", f"{M}/memory/", {"name": "fz.md", "content": "x"}),
        ("PUT", f"{M}/memory/fz2.md/", {"content": "x"}),
        ("PUT", f"{M}/schedule/", {"cron": "0 9 * * 1"}),
        ("POST", f"{M}/compact/", {"kind": "micro"}),
        ("POST", f"{M}/permission/", {"mode": "default"}),
        ("POST", f"{M}/spawn/", {"retire": "on_complete"}),
        ("POST", f"{S}/messages/", {"to": "scout", "body": "hi", "subject": "s"}),
        ("PUT", f"{S}/blackboard/", {"content": "# plan"}),
        ("POST", f"{S}/access/", {"username": "viewer", "role": "viewer"}),
        ("PUT", f"{S}/retention/", {"retention_days": 30}),
        ("PUT", f"{S}/notify/", {"webhook_url": "", "slack_url": "", "emails": []}),
        ("PUT", f"{S}/checks/", {"checks": [{"name": "t", "command": "true", "timeout": 10}]}),
        ("PUT", f"{S}/watchdogs/", {"stale_task_minutes": 60, "stuck_run_minutes": 30, "mailbox_backlog_minutes": 30}),
        ("POST", f"{S}/approvals/999999/approve/", {"reason": "r"}),
        ("POST", f"{S}/questions/999999/answer/", {"answer": "a"}),
        # the cockpit's doors (main after 85a94d6; a 404 on older code)
        ("POST", f"{S}/tasks/", {"title": "t", "spec": "s", "assignee": "scout", "depends_on": [], "verify": "auto"}),
        ("POST", f"{S}/tasks/{{task}}/assign/", {"assignee": "scout"}),
        ("POST", f"{S}/tasks/{{task}}/cancel/", {"reason": "r"}),
        ("PATCH", f"{M}/", {"persona": "p", "max_iterations": 24, "budget_override": 1000, "tools": ["read_file"], "schedule": ""}),
        ("POST", f"{S}/skills/", {"name": "fzs", "body": "b", "description": "d", "overwrite": False}),
        ("POST", f"{M}/skills/", {"name": "fzms", "body": "b", "description": "d", "overwrite": False}),
        # the steering doors (cockpit-b)
        ("POST", f"{M}/chat/", {"body": "hi", "subject": "s"}),
        ("PUT", f"{S}/name/", {"name": "Victim"}),
        ("PUT", f"{S}/budget/", {"member_daily_tokens": 1000, "daily_token_ceiling": 0, "daily_usd_ceiling": "1.5"}),
        ("PUT", f"{M}/budget/", {"budget_override": 1000}),
        ("POST", f"{S}/approval-rules/", {"member": "scout", "tool": "run_command"}),
    ]


def form_cases(victim: str) -> list[tuple[str, dict, str]]:
    """(path, base form, action-less fields to mutate are every key but 'action')."""
    P = f"/spaces/{victim}/manage/"
    return [
        (P, {"action": "grant", "username": "viewer", "role": "viewer"}, ""),
        (P, {"action": "add_member", "name": "fzm", "role": "worker", "persona": "p", "model": "offline", "rule_domains": "conduct"}, ""),
        (P, {"action": "retention", "retention_days": "30"}, ""),
        (P, {"action": "notify", "webhook_url": "", "slack_url": "", "emails": ""}, ""),
        (P, {"action": "watchdogs", "stale_task_minutes": "60", "stuck_run_minutes": "30", "mailbox_backlog_minutes": "30"}, ""),
        (P, {"action": "add_check", "name": "fzc", "command": "true", "timeout": "10"}, ""),
        (P, {"action": "add_mcp", "name": "fzmcp", "url": "http://example.invalid/mcp", "timeout": "10", "env": "A=1"}, ""),
        ("/tokens/", {"action": "create", "name": "fzt"}, ""),
        (f"/spaces/{victim}/tasks/new/", {"action": "create", "title": "t", "spec": "s", "assignee": "scout", "verify": "auto"}, ""),
        (f"/spaces/{victim}/new-member/", {"action": "save", "name": "fzn", "role": "worker", "model": "offline", "max_iterations": "24",
                                           "budget_override": "", "tools": "", "schedule": ""}, ""),
        (f"/spaces/{victim}/members/scout/edit/", {"action": "save", "persona": "p", "model": "offline", "max_iterations": "24",
                                                   "budget_override": "100", "permission_mode": "default"}, ""),
        (f"/spaces/{victim}/skills/", {"action": "add_skill", "name": "fzk", "body": "b", "description": "d"}, ""),
    ]


FORM_VALUES = [("oversize", "x" * 1_000_000), ("long", "y" * 70_000), ("nul", "a\x00b"), ("surrogate", b"a\xed\xa0\x80"),
               ("bad_utf8", b"a\xff"), ("huge_int", HUGE), ("neg", "-1"), ("big", str(10 ** 18)), ("deep", DEEP), ("blank", "")]


def hostile_archives() -> list[tuple[str, bytes]]:
    files = template_files()
    out = []
    for cap in (1, 9, 0, -1):
        out.append((f"blackboard_cap={cap}", build_archive(with_space_toml(files, lambda t, c=cap: re.sub(r"(?m)^blackboard_cap = .*$", f"blackboard_cap = {c}", t)))))
    out.append(("toml nested 5000 deep", build_archive(with_space_toml(files, lambda t: t + "\nx = " + "[" * 5000 + "]" * 5000 + "\n"))))
    out.append(("toml table nested 5000 deep", build_archive(with_space_toml(files, lambda t: t + "\ny = " + "{a = " * 5000 + "1" + "}" * 5000 + "\n"))))
    out.append(("5000-digit integer", build_archive(with_space_toml(files, lambda t: re.sub(r"(?m)^spawn_cap = .*$", "spawn_cap = " + HUGE, t)))))
    out.append(("unknown top-level key", build_archive(with_space_toml(files, lambda t: "evil = 1\n" + t))))
    out.append(("member model NUL", build_archive({**files, "members/lead/member.toml": files["members/lead/member.toml"].replace(b'"offline"', b'"off\\u0000line"')})))
    out.append(("not a tar", b"\x1f\x8b" + os.urandom(2000)))
    no_ws = {k: v for k, v in files.items() if not k.startswith(("workspace/", "starter/"))}
    out.append(("workspace is a file", build_archive({**no_ws, "workspace": b"not a folder"}, dirs=())))
    out.append(("space.toml is a folder", build_archive({k: v for k, v in files.items() if k != "space.toml"}, dirs=("workspace", "space.toml"))))
    out.append(("slug of an existing space in the toml", build_archive(with_space_toml(files, lambda t: re.sub(r'(?m)^slug = .*$', 'slug = "victim"', t)))))
    return out


def bad_inputs(w: World) -> dict:
    from django.db import close_old_connections

    from veronica.ops import webhooks

    w.served.stop_cluster()  # nothing else writes while we compare states
    time.sleep(1)
    counts = {"tried": 0, "5xx": 0, "partial": 0}
    examples: list[str] = []
    state = [db_state()]

    def observe(label: str, response_status: int) -> None:
        close_old_connections()
        after = db_state()
        counts["tried"] += 1
        if response_status >= 500:
            counts["5xx"] += 1
            examples.append(f"5xx {response_status}: {label}")
        if response_status >= 400 and after != state[0]:
            changed = [k for k in after if after[k] != state[0].get(k)]
            counts["partial"] += 1
            examples.append(f"partial write ({', '.join(changed)}) after {response_status}: {label}")
        state[0] = after

    def send(fn, label: str) -> None:
        import requests

        try:
            status = fn().status_code
        except requests.RequestException as exc:
            status = 599
            label += f" ({type(exc).__name__})"
        observe(label, status)

    roles = ("viewer", "operator", "owner")
    # every mutation as the owner (who passes the permission check and reaches the field checks); a
    # sample as viewer and operator, who must be refused before anything is read or written
    stride = {"owner": 2 if w.quick else 1, "operator": 6 if w.quick else 3, "viewer": 6 if w.quick else 3}
    from veronica.swarm import ledger
    from veronica.models import Space

    task = ledger.create_task(Space.objects.get(slug="victim"), "bench", "a task to act on")
    state[0] = db_state()
    cases = [(m, p.replace("{task}", str(task.pk)), b) for m, p, b in api_cases("victim")]
    for method, path, body in cases:
        for field, value in list(body.items()) + [("zz_unknown", 1)]:
            muts = mutations(value) if field != "zz_unknown" else [("unknown_key", 1)]
            for i, (label, replacement) in enumerate(muts):
                raw = encode(body, field, replacement)
                for role in roles:
                    if i % stride[role] == 0:
                        send(lambda: w.users[role].api(method, path, raw=raw), f"{role} {method} {path} {field}={label}")
        for role in roles:  # the body as a whole
            for label, raw in (("deep body", ("[" * 5000 + "]" * 5000).encode()), ("huge int body", HUGE.encode()), ("not json", b"{")):
                send(lambda: w.users[role].api(method, path, raw=raw), f"{role} {method} {path} {label}")
    # the webhook, signed with a real secret
    secret = w.users["owner"].api("POST", "/api/spaces/victim/webhook/secret/").json().get("secret", "")
    observe("rotate", 200)
    for label, body in (("nested 5000", ('{"to": "scout", "body": "x", "extra": ' + DEEP + "}").encode()),
                        ("huge int", ('{"to": "scout", "body": ' + HUGE + "}").encode()),
                        ("nul", b'{"to": "scout", "body": "a\\u0000b"}'), ("surrogate", b'{"to": "scout", "body": "a\\ud800"}'),
                        ("wrong type", b'{"to": ["scout"], "body": 1}'), ("unknown key", b'{"to": "scout", "body": "x", "zz": 1}')):
        ts = str(int(time.time()))
        import requests

        send(lambda: requests.post(w.served.url + "/api/spaces/victim/webhook/", data=body, timeout=30,
                                   headers={"Content-Type": "application/json", webhooks.TIMESTAMP_HEADER: ts,
                                            webhooks.SIGNATURE_HEADER: webhooks.sign(secret, ts, body)}), f"webhook {label}")
    # console forms, with each role's session
    for path, base, _ in form_cases("victim"):
        for field in [k for k in base if k != "action"] + ["zz_unknown"]:
            for i, (label, value) in enumerate(FORM_VALUES):
                for role in roles:
                    if i % stride[role]:
                        continue
                    user = w.users[role]
                    send(lambda: user.form(path, {**base, field: value}, follow=False), f"{role} form {path} {base['action']} {field}={label}")
    # archives on New space (the tenant) and a 1 MB login
    for label, archive in hostile_archives():
        send(lambda: w.new_space(f"fz-{uuid.uuid4().hex[:6]}", archive), f"archive {label}")
    for label, username in (("1 MB username", "u" * MB), ("NUL username", "a\x00b")):
        import requests

        session = requests.Session()
        session.get(w.served.url + "/login/", timeout=10)
        send(lambda: session.post(w.served.url + "/login/", data={"username": username, "password": "x",
                                                                   "csrfmiddlewaretoken": session.cookies.get("csrftoken", "")},
                                  headers={"Referer": w.served.url + "/login/"}, allow_redirects=False, timeout=30), f"login {label}")
    log(f"[bad inputs] {counts['tried']} requests: {counts['5xx']} 5xx, {counts['partial']} partial writes")
    for line in examples[:40]:
        log(f"  {line[:300]}")
    if len(examples) > 40:
        log(f"  ... and {len(examples) - 40} more")
    return counts


# --- the run of one mode (a child process with its own data folder / database) -----------------------------------

def child(args) -> dict:
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "veronica.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from tests.vendors.mock_openai import MockOpenAI

    w = World(args.child, args.quick)
    w.setup()
    mock = MockOpenAI(api_key="sk-attack").start()
    w.mock = mock
    env = {**os.environ, "OPENAI_BASE_URL": mock.base_url, "OPENAI_API_KEY": "sk-attack", "ATTACK_HOST_MARKER": MARKER,
           "PYTHONPATH": str(REPO)}
    w.served = Served(env, Path(os.environ["VERONICA_DATA_DIR"]))
    only = set(args.only.split(",")) if args.only else {"takeover", "sandbox", "exhaust", "input"}
    result: dict = {}
    try:
        w.served.start_web()
        w.served.start_cluster()
        w.login_all()
        started = time.monotonic()
        for name, fn in (("takeover", takeover), ("sandbox", sandbox), ("exhaust", exhaust), ("input", bad_inputs)):
            if name in only:
                t0 = time.monotonic()
                try:
                    result[name] = fn(w)
                except Exception as exc:  # one broken category must not hide the others' counts
                    import traceback

                    traceback.print_exc()
                    result[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                result[name]["seconds"] = round(time.monotonic() - t0, 1)
                log(f"  ({name}: {result[name]['seconds']}s)")
        result["seconds"] = round(time.monotonic() - started, 1)
    finally:
        w.served.stop()
        mock.stop()
        cleanup_host()
    return result


def cleanup_host() -> None:
    """Whatever a probe may have left on the host outside the data folder."""
    for folder in (Path("/usr"), Path("/etc")):
        for path in folder.glob(".attack-*"):
            try:
                path.unlink()
            except OSError:
                pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--modes", default="embedded,hosted")
    parser.add_argument("--quick", action="store_true", help="a smaller sample of each category")
    parser.add_argument("--only", default="", help="comma-separated: takeover,sandbox,exhaust,input")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/11")
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args), default=str))
        return
    os.environ["BENCH_REDIS_URL"] = args.redis
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _setup import isolated_env

    summary = {}
    head = git_head()  # the revision the servers run, read before any of them starts
    for mode in args.modes.split(","):
        log(f"=== {mode} ===")
        with isolated_env(mode, "attack") as env:
            forwarded = ["--quick"] * args.quick + (["--only", args.only] if args.only else [])
            proc = subprocess.run([sys.executable, __file__, "--child", mode, *forwarded], cwd=REPO, env=env,
                                  stdout=subprocess.PIPE, text=True)
            lines = proc.stdout.strip().splitlines()
            if proc.returncode != 0 or not lines:
                raise SystemExit(f"{mode} run failed (exit {proc.returncode})")
            summary[mode] = json.loads(lines[-1])
        log("")
    print(json.dumps({"main": head, **{mode: compact(r) for mode, r in summary.items()}}))


def compact(r: dict) -> dict:
    keep = {"takeover": ("tried", "succeeded"), "sandbox": ("tried", "succeeded"), "exhaust": ("tried", "contained"),
            "input": ("tried", "5xx", "partial")}
    return {cat: {k: r[cat].get(k) for k in keys + ("error",) if k in r[cat]} for cat, keys in keep.items() if cat in r}


def git_head() -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%h"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"


if __name__ == "__main__":
    main()
