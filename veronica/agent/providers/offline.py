"""The offline provider: a deterministic local policy, no network. It is the embedded default,
the demo's team and the test double, and it does real work on real files through the tools.

leader: an operator goal becomes one task per line, assigned round-robin to workers; when every
        task is finished it writes a summary to the blackboard and mails the operator.
worker: explores the files its task names with the read-only tools, then reports with task_done.
It reads replayed waggle blocks like a model would: a step whose output it already has is skipped.
Token usage is estimated as characters / 4 and marked as an estimate.
"""
from __future__ import annotations

import functools
import json
import re
import time
import uuid

from veronica.agent.providers.base import Cancelled, Reply, ToolCall, Usage

MAIL_RE = re.compile(r"^### From (?P<sender>\S+)(?: — (?P<subject>.*?))?(?: \[task #(?P<task>\d+)\])?$", re.M)
ASSIGN_RE = re.compile(r"You are assigned task #(?P<id>\d+): (?P<title>.+?)(?: \(auto-dispatched\))?$", re.M)
PATH_RE = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)+[\w.-]*|[\w-]+\.(?:py|md|csv|txt|toml|json|ya?ml|cfg|ini|js|ts|html))(?![\w/])")
STEP_RE = re.compile(r"^--- step \d+/\d+: (?P<name>\w+)\((?P<args>.*)\)$", re.M)
ARG_RE = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*")')
BLOCK_END_RE = re.compile(r"^\[waggle: end(?: of .*)?\]$", re.M)  # (a block before the short end mark named its route)
ORIENTATION = [("list_dir", {"path": "."}), ("read_file", {"path": "README.md"}), ("glob", {"pattern": "**/*.py"}),
               ("read_file", {"path": "docs/design.md"})]


def simulate_latency(should_stop) -> None:
    """VERONICA_OFFLINE_DELAY_MS: a model call that takes time and can be aborted, like a real one."""
    from django.conf import settings

    deadline = time.monotonic() + settings.OFFLINE_DELAY_MS / 1000
    while time.monotonic() < deadline:
        if should_stop():
            raise Cancelled("offline model call aborted")
        time.sleep(0.02)


def _key(name: str, args: dict) -> str:
    return name + json.dumps({k: str(v) for k, v in sorted(args.items())}, sort_keys=True)


def _size(m: dict) -> int:
    return len(m.get("content") or "") + len(json.dumps(m.get("tool_calls") or []))


class OfflineProvider:
    """One instance serves one run, whose messages only ever grow: what it read of them (the trace
    since the brief, the request size) is kept and extended, so a call costs O(1) in the transcript."""

    label = "offline (deterministic local policy)"

    def __init__(self) -> None:
        self._trace: tuple | None = None  # (brief message, messages fed, last fed message, Trace)
        self._sized: tuple = (0, 0, None)  # (messages sized, their size, the last of them)

    def _done(self, messages: list[dict], brief_at: int) -> "Trace":
        brief = messages[brief_at] if brief_at >= 0 else None
        start = brief_at + 1
        memo = self._trace
        if memo is not None and memo[0] is brief and len(messages) >= start + memo[1] and \
                (memo[1] == 0 or messages[start + memo[1] - 1] is memo[2]):
            trace = memo[3]
            trace.feed(messages[start + memo[1]:])
        else:
            trace = Trace(messages[start:])
            if brief is not None:  # a waggle block appended to the brief (a call the mail named)
                trace._replayed(brief.get("content") or "")
        self._trace = (brief, len(messages) - start, messages[-1] if len(messages) > start else None, trace)
        return trace

    def _size_in(self, system: str, messages: list[dict]) -> int:
        count, size, last = self._sized
        if not (count and len(messages) >= count and messages[count - 1] is last):
            count, size = 0, 0
        size += sum(_size(m) for m in messages[count:])
        self._sized = (len(messages), size, messages[-1] if messages else None)
        return len(system) + size

    def complete(self, system: str, messages: list[dict], tools: list[dict], *, should_stop, on_event=None) -> Reply:
        simulate_latency(should_stop)
        names = {t["name"] for t in tools}
        brief_at = next((i for i in range(len(messages) - 1, -1, -1) if messages[i]["role"] == "user"), -1)
        brief = messages[brief_at]["content"] if brief_at >= 0 else ""
        brief = brief.split("\n\n[waggle: ", 1)[0]  # a replay block appended to the brief is no mail
        done = self._done(messages, brief_at)
        policy = lead if "member_spawn" in names else work
        step = policy(brief, done, names)
        reply = Reply(text=step, tool_calls=[]) if isinstance(step, str) else \
            Reply(text="", tool_calls=[ToolCall(id=f"off_{uuid.uuid4().hex[:12]}", name=step[0], args=step[1])])
        size_in = self._size_in(system, messages)
        size_out = len(reply.text) + len(json.dumps([c.args for c in reply.tool_calls]))
        reply.usage = Usage(input=size_in // 4, output=max(size_out // 4, 1), estimated=True)
        return reply


class Trace:
    """What happened since the brief: each call with its result, plus steps a waggle replayed."""

    def __init__(self, messages: list[dict]) -> None:
        self.results: dict[str, str] = {}
        self.calls: list[tuple[str, dict, str]] = []
        self.pending: dict[str, tuple[str, dict]] = {}
        self.outcomes: dict[int, str] = {}  # task_done's result per task id, kept as calls are fed
        self.feed(messages)

    def feed(self, messages: list[dict]) -> None:
        for m in messages:
            if m["role"] == "assistant":
                for c in m.get("tool_calls") or []:
                    self.pending[c["id"]] = (c["name"], c["args"])
            elif m["role"] == "tool" and m.get("tool_call_id") in self.pending:
                name, args = self.pending[m["tool_call_id"]]
                self.calls.append((name, args, m["content"]))
                if name == "task_done":
                    self.outcomes[_task_id(args)] = m["content"]
                self.results[_key(name, args)] = m["content"]
                self._replayed(m["content"])

    def _replayed(self, content: str) -> None:
        """A waggle block: '--- step i/n: tool(key="value", ...)' headers, each followed by output."""
        marks = list(STEP_RE.finditer(content))
        for i, mark in enumerate(marks):
            end = marks[i + 1].start() if i + 1 < len(marks) else len(content)
            stop = BLOCK_END_RE.search(content, mark.end(), end)
            try:
                args = {k: json.loads(v) for k, v in ARG_RE.findall(mark.group("args"))}
            except json.JSONDecodeError:
                continue
            output = content[mark.end():stop.start() if stop else end].strip()
            self.results.setdefault(_key(mark.group("name"), args), output)

    def has(self, name: str, args: dict) -> bool:
        return _key(name, args) in self.results

    def result(self, name: str, args: dict) -> str:
        return self.results.get(_key(name, args), "")

    def count(self, name: str) -> int:
        return sum(1 for c in self.calls if c[0] == name)


def _task_id(args: dict) -> int:
    try:
        return int(args.get("task_id", 0))
    except (TypeError, ValueError, AttributeError):
        return 0


@functools.lru_cache(maxsize=16)
def mails(brief: str) -> tuple[dict, ...]:
    """The brief's mails (read-only: cached, since a run asks again with the same brief on every call)."""
    marks = list(MAIL_RE.finditer(brief))
    out = []
    for i, mark in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(brief)
        body = brief[mark.end():end].split("\n## ", 1)[0].strip()
        out.append({"sender": mark.group("sender"), "subject": mark.group("subject") or "", "body": body})
    return tuple(out)


# --- leader ------------------------------------------------------------------------------------------

def goal_lines(text: str) -> list[str]:
    lines = [re.sub(r"^\s*(?:[-*•]|\d+[.)])\s*", "", line).strip() for line in text.splitlines()]
    return [line for line in lines if line][:20]


def worker_names(roster: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^- (\S+) \(worker, active", roster, re.M)]


def lead(brief: str, done: Trace, names: set[str]):
    inbox = mails(brief)
    goals = [line for m in inbox if m["sender"] == "operator" for line in goal_lines(m["body"])]
    finished = [m for m in inbox if re.match(r"Task #\d+ (done|failed|verifying)", m["subject"])]
    if goals:
        if not done.has("list_members", {}):
            return ("list_members", {})
        workers = worker_names(done.result("list_members", {})) or ["leader"]
        created = done.count("task_create")
        if created < len(goals):
            line = goals[created]
            return ("task_create", {"title": line[:200], "spec": line, "assignee": workers[created % len(workers)]})
        if done.count("blackboard_write") == 0:
            plan = [c[2].removeprefix("created ") for c in done.calls if c[0] == "task_create"]
            return ("blackboard_write", {"content": "# Plan\n" + "\n".join(f"- {p.splitlines()[0]}" for p in plan)})
        return f"Planned {len(goals)} task(s) and assigned them to {', '.join(sorted(set(workers)))}."
    if finished:
        if not done.has("task_list", {}):
            return ("task_list", {})
        listing = done.result("task_list", {})
        statuses = re.findall(r"^#\d+ \[(\w+)\]", listing, re.M)
        open_count = sum(1 for s in statuses if s not in ("done", "failed", "cancelled"))
        if open_count:
            return f"{open_count} task(s) still open; waiting for them."
        summary = "# Summary\n" + "\n".join(f"- {line.strip()}" for line in listing.splitlines() if line.strip())
        summary = summary[:5000]
        if done.count("blackboard_write") == 0:
            return ("blackboard_write", {"content": summary})
        failed = statuses.count("failed")
        tally = f"{statuses.count('done')} done, {failed} failed"
        if done.count("send_message") == 0:  # a failed task is reported as failed, never counted as done
            subject = f"Goal finished: {tally}" if failed else "Goal complete"
            return ("send_message", {"to": "operator", "subject": subject, "body": summary})
        return f"All tasks are finished ({tally}); the summary is on the blackboard and the operator has it."
    return "Nothing needs me right now."


# --- worker ------------------------------------------------------------------------------------------

def task_paths(text: str) -> list[str]:
    seen: list[str] = []
    for match in PATH_RE.finditer(text):
        path = match.group(1).rstrip(".,;:")
        if path and path not in seen:
            seen.append(path)
    return seen[:6]


def exploration(title: str, spec: str) -> list[tuple[str, dict]]:
    text = f"{title}\n{spec}"
    steps = list(ORIENTATION)
    paths = task_paths(text)
    if re.search(r"TODO|FIXME", text):
        steps.append(("grep", {"pattern": "TODO|FIXME", "path": next((p for p in paths if p.endswith("/")), ".")}))
    for path in paths:
        steps.append(("list_dir", {"path": path}) if path.endswith("/") else ("read_file", {"path": path}))
    return steps


def failed_reads(steps: list[tuple[str, dict]], done: Trace) -> list[str]:
    """What the task named and the worker could not read: it says so instead of inventing a finding."""
    failed = []
    for name, args in steps[len(ORIENTATION):]:
        output = done.result(name, args)
        if output.startswith("error:"):
            failed.append(f"- could not {name.replace('_', ' ')} {args.get('path') or args.get('pattern')}: "
                          f"{output.removeprefix('error:').strip()}")
    return failed


def oriented(done: Trace) -> list[str]:
    """What the orientation turned up that the report relies on: the design notes' first point and
    the Python modules found (a real worker's report draws on what it read, and waggle's ledger
    books a replayed step used only when a reply does)."""
    lines = []
    design = done.result("read_file", {"path": "docs/design.md"})
    point = next((re.sub(r"^\s*\d+\s{2}", "", line).strip(" *") for line in design.splitlines()
                  if re.sub(r"^\s*\d+\s{2}", "", line).lstrip().startswith("*")), "")
    if point and not design.startswith("error:"):
        lines.append(f"- design notes: {point}")
    modules = [line.strip() for line in done.result("glob", {"pattern": "**/*.py"}).splitlines()
               if line.strip().endswith(".py")]
    if modules:
        lines.append(f"- Python modules: {', '.join(modules[:8])}")
    return lines


def findings(steps: list[tuple[str, dict]], done: Trace) -> str:
    lines = oriented(done)
    for name, args in steps[len(ORIENTATION):]:
        output = done.result(name, args)
        if output.startswith("error:"):
            continue  # reported by failed_reads, never as "N lines"
        if name == "read_file":
            body = [re.sub(r"^\s*\d+\s{2}", "", line) for line in output.splitlines()]
            notes = [line.strip() for line in body if re.search(r"TODO|FIXME|def |class ", line)]
            lines.append(f"- {args['path']}: {len(body)} lines" + (f"; {'; '.join(notes[:4])}" if notes else ""))
        elif name == "list_dir":
            lines.append(f"- {args['path']}: {len(output.splitlines())} entries")
        elif name == "grep":
            hits = [h for h in output.splitlines() if h and not h.startswith("(")]
            lines.append(f"- {len(hits)} TODO/FIXME note(s)" + "".join(f"\n  - {h}" for h in hits[:8]))
    return "\n".join(lines) or "- nothing specific named; oriented in the workspace"


@functools.lru_cache(maxsize=16)
def assignments_in(brief: str) -> tuple[tuple[int, str, str], ...]:
    return tuple((int(m.group("id")), m.group("title"), mail["body"]) for mail in mails(brief)
                 for m in [ASSIGN_RE.search(mail["body"])] if m)


def work(brief: str, done: Trace, names: set[str]):
    assignments = assignments_in(brief)
    outcomes = done.outcomes
    refused = {tid: out for tid, out in outcomes.items() if out.startswith("error:")}  # tried once; not again
    for task_id, title, spec in assignments:
        if task_id in outcomes:
            continue
        steps = exploration(title, spec)
        for name, args in steps:
            if not done.has(name, args):
                return (name, args)
        failed = failed_reads(steps, done)
        if failed:
            return ("task_done", {"task_id": task_id, "failed": True,
                                  "result": "\n".join(failed + [findings(steps, done)])})
        return ("task_done", {"task_id": task_id, "result": findings(steps, done)})
    if assignments:
        ok = len({tid for tid, _, _ in assignments} - set(refused))
        return f"Reported {ok} task(s)." + "".join(f" Could not report task {tid}: {out.removeprefix('error:').strip()}"
                                                    for tid, out in sorted(refused.items()))
    return "No task for me in this mail; nothing to do."
