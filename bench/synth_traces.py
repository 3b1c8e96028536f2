"""A second family of agent traces, unlike τ-bench airline, to check replay_eval's figures on.

    .venv/bin/python bench/synth_traces.py OUT_DIR [--tasks 60] [--trials 3] [--seed 7]
    .venv/bin/python bench/replay_eval.py --traces OUT_DIR/trajectories.jsonl.gz

A coding agent in a repository (same trace format as τ-bench: task_id, trial, messages; writes
``tools.json`` beside it). Every task has its own repository; trials of a task are near-copies
(the same files, the agent's choices drawn again). What the agent does, with how predictable it is:

* ``git_status()`` then ``git_diff(path=...)`` for the changed files in list order: it walks the
  whole list 90 % of the time (a literal trigger, a fan-out over ``changed[*].path``);
* ``grep(pattern, path=".")`` then ``read_file`` of the first matches, stopping after each with
  probability 1/2 (a coin flip: replaying it would be wrong half the time);
* ``read_file(path=module)`` then ``list_tests(module=module)`` 60 % of the time (a parameter
  carried from an argument, not an output);
* free-text calls (``think``), and mutating ``edit_file`` / ``run_tests`` between phases;
* the agent's text after each phase reports what it read, as a real agent does: for each diff,
  file or test list it read, with probability 3/4, one specific thing that only that output held
  (the function a hunk touches, a function a file defines, a test's name), so a judge that looks
  for values a reply drew on has something to see, and a read the agent did not use stays silent;
* then up to two follow-up user messages: one naming a file, which the agent reads first 90 % of
  the time when it has not looked at it yet (an inbound route: the argument is a token of the
  message), or one naming two files it reads in either order (no single pending value: nothing
  should fire).
"""
from __future__ import annotations

import argparse
import gzip
import json
import random
from pathlib import Path

READ_ONLY = ["git_status", "git_diff", "grep", "read_file", "list_tests", "think"]
MUTATING = ["edit_file", "run_tests"]
WORDS = ["parser", "cache", "router", "auth", "models", "views", "utils", "config", "jobs", "mail"]


class Trace:
    def __init__(self) -> None:
        self.messages: list[dict] = []
        self.n = 0

    def say(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})

    def report(self, rng: random.Random, facts: list[str], lead: str) -> None:
        """The agent's text after some reads: each fact it learned, said with probability 3/4."""
        said = [f for f in facts if rng.random() < 0.75]
        self.say(lead + (" " + "; ".join(said) + "." if said else ""))

    def looked_at(self) -> set[str]:
        """Every path a call so far named."""
        return {c["args"]["path"] for m in self.messages for c in m.get("tool_calls") or []
                if isinstance(c["args"].get("path"), str)}

    def user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    def call(self, name: str, args: dict, output) -> None:
        self.n += 1
        cid = f"call_{self.n}"
        self.messages.append({"role": "assistant", "content": None,
                              "tool_calls": [{"id": cid, "name": name, "args": args}]})
        text = output if isinstance(output, str) else json.dumps(output)
        self.messages.append({"role": "tool", "tool_call_id": cid, "name": name, "content": text})


def repo(rng: random.Random, task: int) -> dict:
    mods = rng.sample(WORDS, 5)
    files = [f"pkg{task}/{m}.py" for m in mods]
    return {
        "files": files,
        "changed": rng.sample(files, rng.randint(1, 4)),
        "pattern": rng.choice(["TODO", "FIXME", "deprecated", "XXX"]) + str(task),
        "matches": rng.sample(files, rng.randint(2, 5)),
        "module": rng.choice(files),
    }


def stem(path: str) -> str:
    return path.rsplit("/", 1)[-1].removesuffix(".py")


def funcs(path: str) -> list[str]:
    """Functions a file defines (specific to the file: its task number and stem)."""
    task = path.split("/", 1)[0].removeprefix("pkg")
    return [f"{stem(path)}_{name}{task}" for name in ("load", "parse", "flush", "check", "render", "merge")]


def body(path: str) -> str:
    return f"# {path}\n" + "\n".join(f"def {f}():\n    return {i}" for i, f in enumerate(funcs(path)))


def diff(path: str) -> dict:
    touched = funcs(path)[len(path) % 6]
    return {"path": path, "hunks": [f"@@ -{10 * k + 3},6 +{10 * k + 3},8 @@ def {touched}():" for k in range(3)],
            "function": touched}


def trial(rng: random.Random, r: dict) -> Trace:
    t = Trace()
    t.user(f"Please look at the open change and fix {r['pattern']} in {r['module']}.")
    phases = ["status", "grep", "module"]
    rng.shuffle(phases)
    for phase in phases:
        facts: list[str] = []
        if phase == "status":
            t.call("git_status", {}, {"branch": "main", "changed": [{"path": p, "state": "M"} for p in r["changed"]]})
            walk = r["changed"] if rng.random() < 0.9 else r["changed"][:rng.randint(0, len(r["changed"]) - 1)]
            for p in walk:
                t.call("git_diff", {"path": p}, diff(p))
                facts.append(f"the change in {p} touches {diff(p)['function']}()")
        elif phase == "grep":
            t.call("grep", {"pattern": r["pattern"], "path": "."},
                   {"matches": [{"file": p, "line": 10 + i} for i, p in enumerate(r["matches"])]})
            for p in r["matches"]:
                t.call("read_file", {"path": p}, body(p))
                facts.append(f"{p} defines {rng.choice(funcs(p))}()")
                if rng.random() < 0.5:
                    break
        else:
            t.call("read_file", {"path": r["module"]}, body(r["module"]))
            facts.append(f"{r['module']} defines {rng.choice(funcs(r['module']))}()")
            if rng.random() < 0.6:
                tests = [f"test_{stem(r['module'])}_{k}{r['pattern'][-2:]}" for k in ("roundtrip", "empty", "large")]
                t.call("list_tests", {"module": r["module"]}, {"tests": tests})
                facts.append(f"its tests include {rng.choice(tests)}")
        if rng.random() < 0.5:
            t.call("think", {"thought": f"next step {rng.random():.6f}"}, "ok")
        if rng.random() < 0.7:
            t.call("edit_file", {"path": r["module"], "patch": f"fix {rng.random():.6f}"}, "edited")
            t.call("run_tests", {}, "passed" if rng.random() < 0.8 else "1 failed")
        t.report(rng, facts, "Done with this part.")
    # follow-up messages with literal values (inbound routes): one path, which the agent reads
    # first 90 % of the time when it has not looked at it yet (else it greps for the module's name
    # first; a file it already looked at it re-reads half the time), or two paths (the agent reads
    # those it has not looked at, in either order: two pending values, so waggle must stay quiet)
    seen = t.looked_at()
    for _ in range(rng.randint(0, 2)):
        extra = [p for p in r["files"] if p != r["module"]]
        if rng.random() < 0.7:
            p = rng.choice(extra)
            t.user(rng.choice([f"Also have a look at {p}, please.", f"Can you check {p} too?",
                               f"One more: {p}"]))
            if p in seen and rng.random() < 0.5:
                t.say(f"I read {p} already; nothing new there.")
                continue
            if p not in seen and rng.random() >= 0.9:
                t.call("grep", {"pattern": p.rsplit("/", 1)[-1].removesuffix(".py"), "path": "."},
                       {"matches": [{"file": p, "line": 1}]})
            t.call("read_file", {"path": p}, body(p))
            seen.add(p)
            t.report(rng, [f"{p} defines {rng.choice(funcs(p))}()"], "Looked at it.")
            continue
        else:
            a, b = rng.sample(extra, 2)
            t.user(f"Compare {a} with {b}.")
            facts = []
            for p in rng.sample([x for x in (a, b) if x not in seen], len([x for x in (a, b) if x not in seen])):
                t.call("read_file", {"path": p}, body(p))
                seen.add(p)
                facts.append(f"{p} defines {rng.choice(funcs(p))}()")
            t.report(rng, facts, "Looked at it.")
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--tasks", type=int, default=60)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with gzip.open(out / "trajectories.jsonl.gz", "wt", encoding="utf-8") as fh:
        for task in range(args.tasks):
            r = repo(rng, task)
            for k in range(args.trials):
                t = trial(rng, r)
                fh.write(json.dumps({"task_id": task, "trial": k, "reward": 1.0, "messages": t.messages}) + "\n")
    (out / "tools.json").write_text(json.dumps({"read_only": READ_ONLY, "mutating": MUTATING}, indent=1))
    print(f"wrote {args.tasks * args.trials} trajectories to {out}")


if __name__ == "__main__":
    main()
