"""waggle on recorded agent trajectories: mine on some tasks, replay on held-out ones.

    .venv/bin/python bench/replay_eval.py [--traces PATH] [--seeds 5] [--train-frac 0.5] [--folds K]
                                          [--no-baseline] [--code-dir DIR]

It drives waggle's own code paths, the ones a live member uses: ``service.observe`` (recorder and
the periodic sweep), ``service.inbound`` (the inbound message), ``service.sweep`` (miner and promoter), ``service.follow`` (replayer) and
``service.settle`` (the ledger), on a throw-away SQLite database. The recorded trajectory stands in
for the model:

* split by ``task_id`` (every trial of a task on one side), per seed: training trajectories are
  observed one session each, then the space is swept until no new route is stored; held-out
  trajectories are then walked with mining off (the library is frozen);
* each user message is the message that woke the member: ``service.inbound`` records it (while
  training) or may replay a call it names (held out: an inbound route, ``waggle.inbound``); its
  block lands right after the message, before the model's next call (``--deaf`` leaves messages out);
* after each read-only call the model made, ``follow`` may replay steps (the exec answers with the
  recorded output of that call when any trajectory made it);
* a replayed step is *used* if the recorded model makes that same call (tool and arguments) before
  its next non-matching call: it is then skipped (not made, not observed) and saves one round
  trip; every other replayed step is a *miss*. That is the harness's truth (``precision_pct``);
* the ledger is kept by the host's own judge, as in a live run: each model reply (its text and
  the calls a replay did not stand in for) goes to ``service.judge_reply`` and the end of the
  trajectory to ``service.end_run``; what it booked is ``booked_precision_pct`` (used steps over
  replayed steps in the ledger), and its demotions steer the rest of the walk. A replay no reply
  followed (the trajectory ends first: BFCL's turns end on an empty reply) is left unjudged by the
  host (``waggle.judging.end_run``), and so is one the model answered only with calls (no text to the
  end: BFCL has none) that decided none of its steps, each of which had something to show:
  ``unjudged_steps`` counts those steps, left out of
  ``booked_precision_pct`` (the harness's truth still counts them in ``precision_pct``). ``--truth-ledger``
  books the harness's truth instead (``service.settle``), as runs before the honest ledger did;
* tokens: each model request reads the system prompt and every message before it (chars / 4).
  A used step's request and result leave the conversation; a replay block enters it right after
  the tool result it was appended to, so every later request reads it (a miss costs its output
  on every later request). ``--dump-fires PATH`` writes each fire (trajectory, message index,
  steps, the harness's truth and the host's verdict per step, the evidence it judged on) for
  case-by-case review. ``net_tokens_saved_pct`` is (input tokens without waggle - with) over
  input tokens without waggle.

The last line is one JSON object averaged over seeds, or with ``--folds K`` pooled over K folds
(every task held out exactly once, trained on the other K-1 folds); the baseline line before it
runs today's ``main`` the same way (``git archive main`` into a temp dir, imported instead of this
tree). Every figure is held out: nothing is mined from a task that is then replayed on.
``bench/replay_ceiling.py`` gives the most any list-walk replay could save on the same file.
Trace format: one JSON object per line (gzip or plain): ``task_id``, ``trial``, ``messages``
(``role`` user|assistant|tool; assistant ``tool_calls: [{id, name, args}]``; tool ``content``).
Which tools mutate: ``tools.json`` next to the traces (``{"read_only": [...], "mutating": [...]}``),
else every tool is taken as read-only except those named by ``--mutating``.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
DEFAULT_TRACES = HERE.parent.parent / "shared" / "data" / "tau-airline" / "trajectories.jsonl.gz"
if not DEFAULT_TRACES.exists():
    DEFAULT_TRACES = Path("/work/shared/data/tau-airline/trajectories.jsonl.gz")


def tokens(text: str) -> int:
    return (len(text) + 3) // 4


def norm(args) -> str:
    return json.dumps(args if isinstance(args, dict) else {}, sort_keys=True, ensure_ascii=False)


def lookup_key(tool: str, args) -> str:
    """Calls the same up to argument types (the baseline stringifies values): output lookup only."""
    flat = {str(k): v if isinstance(v, str) else json.dumps(v, sort_keys=True) for k, v in (args or {}).items()}
    return tool + json.dumps(flat, sort_keys=True, ensure_ascii=False)


def load(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def tool_kinds(path: Path, extra_mutating: list[str]) -> set[str]:
    spec = path.parent / "tools.json"
    mutating = set(extra_mutating)
    if spec.exists():
        mutating |= set(json.loads(spec.read_text()).get("mutating", []))
    return mutating


def system_tokens(path: Path) -> int:
    policy = path.parent / "policy.md"
    return tokens(policy.read_text()) if policy.exists() else 0


def message_tokens(m: dict) -> int:
    n = tokens(m.get("content") or "")
    if m.get("tool_calls"):
        n += tokens(json.dumps([{"name": c["name"], "args": c["args"]} for c in m["tool_calls"]]))
    return n


@dataclass
class Tally:
    read_only_calls: int = 0
    round_trips_saved: int = 0
    replayed_steps: int = 0
    replayed_steps_used: int = 0
    fires: int = 0
    heard_fires: int = 0  # fires on an inbound message (inbound routes)
    input_tokens: int = 0
    input_tokens_with_waggle: int = 0
    routes: int = 0
    booked_steps: int = 0  # replayed steps in the ledger (what the host's judge booked)
    booked_used: int = 0   # ... of those booked used
    unjudged_steps: int = 0  # replayed steps no reply followed (the run ended first): in neither figure
    per_route: dict = field(default_factory=dict)  # route name -> [replayed, used] (diagnostics)

    def line(self) -> dict:
        return {
            "read_only_calls": self.read_only_calls,
            "round_trips_saved": self.round_trips_saved,
            "saved_pct": round(100 * self.round_trips_saved / max(1, self.read_only_calls), 2),
            "replayed_steps": self.replayed_steps,
            "replayed_steps_used": self.replayed_steps_used,
            # nothing replayed: nothing was wrong
            "precision_pct": round(100 * self.replayed_steps_used / self.replayed_steps, 2) if self.replayed_steps else 100.0,
            "booked_precision_pct": round(100 * self.booked_used / self.booked_steps, 2) if self.booked_steps else 100.0,
            "unjudged_steps": self.unjudged_steps,
            "net_tokens_saved_pct": round(100 * (self.input_tokens - self.input_tokens_with_waggle)
                                          / max(1, self.input_tokens), 3),
            "fires": self.fires,
            "heard_fires": self.heard_fires,
            "routes": self.routes,
        }


class Harness:
    def __init__(self, service, config, traces: list[dict], mutating: set[str], sys_tokens: int) -> None:
        self.service = service
        self.config = config
        self.traces = traces
        self.mutating = mutating
        self.sys_tokens = sys_tokens
        self.outputs: dict[str, str] = {}
        by_tool: dict[str, list[str]] = {}
        for t in traces:
            for call, out in calls_of(t):
                self.outputs.setdefault(lookup_key(call["name"], call["args"]), out)
                by_tool.setdefault(call["name"], []).append(out)
        # a replayed call no trajectory made: answer with a typical output of that tool (its size
        # is what a miss costs)
        self.typical = {tool: sorted(outs, key=len)[len(outs) // 2] for tool, outs in by_tool.items()}
        self.exec_log: list[tuple[str, dict]] = []
        self.own: dict[str, str] = {}  # the walked trajectory's own outputs (see exec)
        self.verbose = False
        self.deaf = False  # --deaf: leave the user messages out (the call-only figures)
        self.truth_ledger = False  # --truth-ledger: book the harness's truth, not the host's judge
        self.fire_log: list[dict] | None = None  # --dump-fires: each fire, its truth and its booked verdicts

    def exec(self, tool: str, args: dict) -> str:
        """A replayed call's output: what the trajectory being walked got for that call when it made
        it (the same call can return other things in another task's state: BFCL's long-context
        copies pad the outputs of the same calls), else what any trajectory got, else typical."""
        self.exec_log.append((tool, dict(args)))
        key = lookup_key(tool, args)
        return self.own.get(key) or self.outputs.get(key) or self.typical.get(tool) or "{}"

    def walking(self, traj: dict) -> None:
        """The trajectory ``exec`` answers from first (see :meth:`exec`)."""
        self.own = {}
        for call, out in calls_of(traj):
            self.own.setdefault(lookup_key(call["name"], call["args"]), out)

    def run_seed(self, seed: int, train_frac: float, folds: int = 0) -> Tally:
        """One held-out evaluation: with ``folds`` (k-fold by task), fold ``seed`` is held out and
        every other task trains; else a random ``train_frac`` of the tasks trains."""
        svc = self.service
        space = f"eval-{seed}"
        tasks = sorted({t["task_id"] for t in self.traces}, key=str)
        rng = random.Random(0 if folds else seed)
        rng.shuffle(tasks)
        if folds:
            held = set(tasks[seed::folds])
            train = set(tasks) - held
        else:
            train = set(tasks[: max(1, int(round(len(tasks) * train_frac)))])
        cfg = self.config
        frozen = replace(cfg, mine_period=10 ** 9)
        hears = hasattr(svc, "inbound") and not self.deaf  # today's main has no inbound routes
        for i, t in enumerate(t for t in self.traces if t["task_id"] in train):
            session = f"train-{i}"
            for kind, call, out in events_of(t, messages=hears):
                if kind == "user":  # the member's inbound message: recorded only, while training
                    svc.inbound(space, session, "m", call, None, config=cfg)
                    continue
                svc.observe(space, session, "m", call["name"], call["args"], call["name"] in self.mutating, out,
                            config=cfg)
        for _ in range(200):  # one route per sweep: sweep until the library is complete
            if svc.sweep(space, config=cfg) is None:
                break
        from waggle.models import Waggle

        tally = Tally(routes=Waggle.objects.filter(space_key=space, disabled=False).count())
        if self.verbose:
            for w in Waggle.objects.filter(space_key=space):
                print(w.script, "reach", w.route.get("reach"), file=sys.stderr)
        for i, t in enumerate(t for t in self.traces if t["task_id"] not in train):
            self.walk(space, f"held-{i}", t, frozen, tally)
        from django.db.models import Sum
        from waggle.models import LedgerEntry

        booked = LedgerEntry.objects.filter(space_key=space, on_demand=False, settled=True).aggregate(
            steps=Sum("steps"), used=Sum("used_steps"))
        tally.booked_steps, tally.booked_used = booked["steps"] or 0, booked["used"] or 0
        tally.unjudged_steps = LedgerEntry.objects.filter(space_key=space, on_demand=False, settled=False).aggregate(
            steps=Sum("steps"))["steps"] or 0
        if self.fire_log is not None:
            self.booked_verdicts(space, seed)
        return tally

    def booked_verdicts(self, space: str, seed: int) -> None:
        """Each logged fire of this space gets the host judge's verdict per step (its FiredPlan row:
        the fires of one session in order, failed replays aside, as the walk logged them)."""
        from waggle.models import FiredPlan

        rows: dict[str, list] = {}
        for row in FiredPlan.objects.filter(space_key=space, ledger_id__isnull=False).order_by("id"):
            rows.setdefault(row.session_key, []).append(row)
        for fire in self.fire_log:
            if fire.get("space") != space or "booked" in fire:
                continue
            row = rows.get(fire["session"], []).pop(0) if rows.get(fire["session"]) else None
            fire["seed"] = seed
            fire["booked"] = [s[7] if len(s) > 7 else None for s in row.tail] if row else None
            fire["evidence"] = [s[6] if len(s) > 6 else None for s in row.tail] if row else None

    def walk(self, space: str, session: str, traj: dict, cfg, tally: Tally) -> None:
        svc = self.service
        self.walking(traj)
        msgs = traj["messages"]
        results = results_of(msgs)
        removed: set[int] = set()
        inserted: dict[int, int] = {}
        open_fires: list[list] = []  # [steps, used flags, route name]

        def logged(steps: list, used: list, name: str, at: int) -> None:
            if self.fire_log is not None:
                self.fire_log.append({"space": space, "session": session, "task": traj.get("task_id"),
                                      "trial": traj.get("trial"), "at": at, "route": name,
                                      "steps": [[t, a] for t, a in steps], "truth": used})

        def close() -> None:
            for steps, used, name in open_fires:
                tally.replayed_steps_used += sum(used)
                counts = tally.per_route.setdefault(name, [0, 0])
                counts[0] += len(used)
                counts[1] += sum(used)
                if self.truth_ledger and hasattr(svc, "settle"):
                    svc.settle(space, session, used, config=cfg)
            open_fires.clear()

        hears = hasattr(svc, "inbound") and not self.deaf
        for i, m in enumerate(msgs):
            if m["role"] == "user" and hears:  # the inbound message: a replay block may land before the next call
                self.exec_log = []
                block = svc.inbound(space, session, "m", m.get("content") or "", self.exec, config=cfg)
                if block:
                    tally.fires += 1
                    tally.heard_fires += 1
                    steps = list(self.exec_log)
                    name = self.fired_route(space, session)
                    open_fires.append([steps, [False] * len(steps), name])
                    logged(steps, open_fires[-1][1], name, i)
                    tally.replayed_steps += len(steps)
                    inserted[i] = inserted.get(i, 0) + tokens("\n\n" + block)
                continue
            if m["role"] == "assistant" and not self.truth_ledger:
                self.judge(space, session, m, open_fires, cfg)
            if m["role"] != "assistant" or not m.get("tool_calls"):
                continue
            skipped_all = True
            for call in m["tool_calls"]:
                name, args = call["name"], call["args"] if isinstance(call["args"], dict) else {}
                ri, out = results.get(id(call), (None, ""))
                if name not in self.mutating:
                    tally.read_only_calls += 1
                hit = False
                for steps, used, _ in open_fires:
                    for j, (tool, targs) in enumerate(steps):
                        if not used[j] and tool == name and norm(targs) == norm(args):
                            used[j] = True
                            hit = True
                            break
                    if hit:
                        break
                if hit:
                    tally.round_trips_saved += 1
                    if ri is not None:
                        removed.add(ri)
                    continue
                skipped_all = False
                close()
                mutates = name in self.mutating
                svc.observe(space, session, "m", name, args, mutates, out, config=cfg)
                if mutates or out.lower().startswith("error"):
                    continue
                self.exec_log = []
                block = svc.follow(space, session, self.exec, config=cfg)
                if block:
                    tally.fires += 1
                    steps = list(self.exec_log)
                    name = self.fired_route(space, session)
                    open_fires.append([steps, [False] * len(steps), name])
                    logged(steps, open_fires[-1][1], name, i if ri is None else ri)
                    tally.replayed_steps += len(steps)
                    if ri is not None:
                        inserted[ri] = inserted.get(ri, 0) + tokens("\n\n" + block)
            if skipped_all:
                removed.add(i)
        close()
        if not self.truth_ledger and hasattr(svc, "end_run"):  # the run ends: what no reply drew on is unused
            svc.end_run(space, session, config=cfg)
        tally.input_tokens += self.input_tokens(msgs, set(), {})
        tally.input_tokens_with_waggle += self.input_tokens(msgs, removed, inserted)

    @staticmethod
    def fired_route(space: str, session: str) -> str:
        """The route of the session's latest replay (the block does not name it)."""
        from waggle.models import FiredPlan

        return FiredPlan.objects.filter(space_key=space, session_key=session).order_by("-id").values_list(
            "name", flat=True).first() or ""

    def judge(self, space: str, session: str, m: dict, open_fires: list, cfg) -> None:
        """The host's judge hears the reply as a live run would: its text, and the calls no open
        replay stood in for (those the harness skips: the model never made them)."""
        used = [list(u) for _, u, _ in open_fires]
        calls = []
        for call in m.get("tool_calls") or []:
            name, args = call["name"], call["args"] if isinstance(call["args"], dict) else {}
            hit = False
            if len(calls) == 0:  # (the harness's hits end at the reply's first call no replay made)
                for (steps, _, _), flags in zip(open_fires, used):
                    j = next((j for j, (tool, targs) in enumerate(steps)
                              if not flags[j] and tool == name and norm(targs) == norm(args)), None)
                    if j is not None:
                        flags[j] = hit = True
                        break
            if not hit:
                calls.append((name, args))
        try:
            self.service.judge_reply(space, session, calls, text=m.get("content") or "", config=cfg)
        except TypeError:  # a service from before the honest ledger: no text
            self.service.judge_reply(space, session, calls, config=cfg)

    def input_tokens(self, msgs: list[dict], removed: set[int], inserted: dict[int, int]) -> int:
        total = 0
        context = self.sys_tokens
        for i, m in enumerate(msgs):
            if i in removed:
                continue
            if m["role"] == "assistant":
                total += context
            context += message_tokens(m) + inserted.get(i, 0)
        return total


def results_of(msgs: list[dict]) -> dict[int, tuple[int, str]]:
    """Each call's result, keyed by ``id(call)``: (index of the tool message, its content). A call
    id may repeat in one trajectory (τ-bench's file reuses some): each tool message answers the
    oldest call still waiting under its id, so a result is never taken from another call."""
    waiting: dict[str, list[dict]] = {}
    out: dict[int, tuple[int, str]] = {}
    for i, m in enumerate(msgs):
        if m["role"] == "assistant":
            for c in m.get("tool_calls") or []:
                waiting.setdefault(c.get("id"), []).append(c)
        elif m["role"] == "tool" and waiting.get(m.get("tool_call_id")):
            out[id(waiting[m.get("tool_call_id")].pop(0))] = (i, m.get("content") or "")
    return out


def events_of(traj: dict, messages: bool = True):
    """("user", text, None) for each user message (when ``messages``) and ("call", call, output)
    for each tool call, in order."""
    results = {k: v for k, (_, v) in results_of(traj["messages"]).items()}
    for m in traj["messages"]:
        if m["role"] == "user" and messages:
            yield "user", m.get("content") or "", None
        elif m["role"] == "assistant":
            for c in m.get("tool_calls") or []:
                yield "call", c, results.get(id(c), "")


def calls_of(traj: dict):
    results = {k: v for k, (_, v) in results_of(traj["messages"]).items()}
    for m in traj["messages"]:
        if m["role"] == "assistant":
            for c in m.get("tool_calls") or []:
                yield c, results.get(id(c), "")


def setup_django(code_dir: Path) -> None:
    sys.path.insert(0, str(code_dir))
    data = tempfile.mkdtemp(prefix="replay-eval-")
    os.environ["VERONICA_DATA_DIR"] = data
    os.environ.pop("DATABASE_URL", None)
    os.environ.pop("REDIS_URL", None)
    os.environ["VERONICA_WAGGLE_SWEEP_ASYNC"] = "0"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "veronica.settings")
    import logging

    import django

    django.setup()
    logging.getLogger("waggle").setLevel(logging.ERROR)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def evaluate(args) -> dict:
    setup_django(Path(args.code_dir).resolve() if args.code_dir else HERE)
    from waggle import service
    from waggle.config import default_config

    config = default_config()
    for item in args.set or []:  # sensitivity runs: --set confidence_z=1.0
        key, _, value = item.partition("=")
        config = replace(config, **{key: type(getattr(config, key))(value)})
    path = Path(args.traces)
    traces = load(path)
    h = Harness(service, config, traces, tool_kinds(path, args.mutating or []), system_tokens(path))
    h.verbose = args.verbose
    h.deaf = args.deaf
    h.truth_ledger = args.truth_ledger
    h.fire_log = [] if args.dump_fires else None
    lines = []
    pooled = Tally()
    for seed in args.only or range(args.folds or args.seeds):
        tally = h.run_seed(seed, args.train_frac, args.folds)
        lines.append(tally.line())
        for f in ("read_only_calls", "round_trips_saved", "replayed_steps", "replayed_steps_used", "fires", "heard_fires",
                  "input_tokens", "input_tokens_with_waggle", "routes", "booked_steps", "booked_used", "unjudged_steps"):
            setattr(pooled, f, getattr(pooled, f) + getattr(tally, f))
        print(f"seed {seed}: {json.dumps(tally.line())}", file=sys.stderr)
        if args.verbose:
            for name, (n, used) in sorted(tally.per_route.items()):
                print(f"    {name}: {used} of {n} replayed steps used", file=sys.stderr)
    if args.dump_fires:
        Path(args.dump_fires).write_text(json.dumps(h.fire_log, ensure_ascii=False, indent=1))
    keys = lines[0].keys()
    if args.folds:  # every task held out once: pool the folds (small folds make noisy ratios)
        return pooled.line() | {"routes": round(pooled.routes / len(lines), 3), "folds": args.folds}
    mean = {k: round(statistics.fmean(line[k] for line in lines), 3) for k in keys}
    return mean | {"seeds": args.seeds}


def baseline(args) -> dict | None:
    """Run this script against ``main`` (today's code) in a temp copy; its last line back."""
    tmp = Path(tempfile.mkdtemp(prefix="replay-eval-main-"))
    try:
        archive = subprocess.run(["git", "-C", str(HERE), "archive", args.baseline_ref], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive.stdout, check=True)
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        print(f"baseline: could not check out {args.baseline_ref}: {exc}", file=sys.stderr)
        return None
    cmd = [sys.executable, str(Path(__file__).resolve()), "--code-dir", str(tmp), "--no-baseline",
           "--traces", str(args.traces), "--seeds", str(args.seeds), "--train-frac", str(args.train_frac)]
    if args.folds:
        cmd += ["--folds", str(args.folds)]
    for name in args.mutating or []:
        cmd += ["--mutating", name]
    got = subprocess.run(cmd, capture_output=True, text=True)
    if got.returncode != 0:
        print(f"baseline run failed:\n{got.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(got.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", default=str(DEFAULT_TRACES))
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--train-frac", type=float, default=0.5)
    ap.add_argument("--folds", type=int, default=0,
                    help="k-fold by task instead of random halves: every task held out exactly once")
    ap.add_argument("--mutating", action="append", help="a tool that changes state (repeatable)")
    ap.add_argument("--code-dir", help="import waggle and veronica from this checkout instead of this tree")
    ap.add_argument("--no-baseline", action="store_true", help="skip the run of today's main")
    ap.add_argument("--baseline-ref", default="main")
    ap.add_argument("--only", type=int, action="append", help="run only this seed / fold (diagnostics)")
    ap.add_argument("--deaf", action="store_true", help="do not pass the user messages in (no inbound routes)")
    ap.add_argument("--truth-ledger", action="store_true",
                    help="book the harness's truth in the ledger instead of the host's judge (runs before issue 24)")
    ap.add_argument("--dump-fires", metavar="PATH",
                    help="write each fire (trajectory, message index, steps, true and booked verdicts) as JSON")
    ap.add_argument("-v", "--verbose", action="store_true", help="per-route figures on stderr")
    ap.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="override one waggle default for this run (sensitivity analysis; not the baseline)")
    args = ap.parse_args()
    base = None if args.no_baseline else baseline(args)
    ours = evaluate(args)
    if base is not None:
        print("baseline (" + args.baseline_ref + "): " + json.dumps(base))
    print(json.dumps(ours))


if __name__ == "__main__":
    main()
