"""Paired A/B of one agent step between two revisions, on this noisy host.

    .venv/bin/python bench/ab.py A [B] [--modes embedded,hosted] [--rounds 11]

A and B are git revisions (B defaults to the work tree as it is, uncommitted changes included). Each
side runs in a long-lived process of its own, on its own throwaway database (bench._setup), with the
revision's veronica on its path and bench/_inproc.py's zero-latency scripted step. The two processes
take turns, one 30-step run each per turn, in alternating order (A B, B A, ...), so both see the same
moments of the host: the host's speed swings 2-3x within minutes here, and a before/after measured ten
minutes apart says more about the host than about the change. Per mode it prints each side's median
step (ms, call to call), CPU and statements per step, and the median of the rounds' B / A ratios
with their interquartile range. Four A/A runs (HEAD against HEAD, 11 rounds) gave ratios of 0.93-1.07
in both modes on this host: a difference smaller than ~7 % needs more rounds, or is not there.
The last line is one JSON object: {"embedded": {"a_step_ms": .., "b_step_ms": .., "ratio": ..}, ...}.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._setup import REPO, isolated_env, pct  # noqa: E402

INPROC = Path(__file__).with_name("_inproc.py")
FIGURES = ("step_ms", "cpu_ms", "sql")
STEPS = 30  # per run: a 10-step run's median swings ~10 % from run to run here


def serve(tree: str) -> None:
    """The child: the revision in `tree`, one run per line read from stdin, one JSON line each back."""
    sys.path.insert(0, tree)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "veronica.settings")
    import logging

    import django

    django.setup()
    logging.disable(logging.CRITICAL)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    spec = importlib.util.spec_from_file_location("bench_inproc", INPROC)  # by path: this tree's bench
    inproc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(inproc)
    workdir = Path(tempfile.mkdtemp(prefix="bench-ab-work-"))
    for i in range(6):
        (workdir / f"f{i}.txt").write_text("".join(f"line {j} of file {i}\n" for j in range(20)))
    space, (worker,) = inproc.make_space("ab", 1, workdir)
    inproc.one_run(space, worker)  # warm: imports, compiled statements, prepared plans
    print(json.dumps({"ready": True}), flush=True)
    for _line in sys.stdin:
        row = inproc.one_run(space, worker, STEPS)
        print(json.dumps({k: row[k] for k in FIGURES}), flush=True)
    shutil.rmtree(workdir, ignore_errors=True)


def checkout(rev: str | None, stack: ExitStack) -> str:
    """A detached worktree of `rev` (removed on exit), or the repository itself for None."""
    if rev is None:
        return str(REPO)
    path = tempfile.mkdtemp(prefix="bench-ab-tree-")
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", path, rev], check=True)
    stack.callback(lambda: subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", path],
                                          capture_output=True))
    return path


def start(tree: str, env: dict) -> subprocess.Popen:
    env = {**env, "PYTHONHASHSEED": "0"}  # the same string hashing on both sides
    proc = subprocess.Popen([sys.executable, __file__, "--serve", tree], cwd=tree, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    ready = proc.stdout.readline()
    if not ready.strip().startswith("{"):
        proc.kill()
        raise SystemExit(f"the side in {tree} did not start (exit {proc.wait()})")
    return proc


def one(proc: subprocess.Popen) -> dict:
    proc.stdin.write("run\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"a side stopped (exit {proc.wait()})")
    return json.loads(line)


def compare(mode: str, trees: tuple[str, str], rounds: int) -> dict:
    rows: dict[str, list[dict]] = {"a": [], "b": []}
    with ExitStack() as stack:
        procs = {}
        for side, tree in zip("ab", trees):
            env = stack.enter_context(isolated_env(mode, f"bench_ab_{side}"))
            procs[side] = start(tree, env)
            stack.callback(procs[side].kill)
        for i in range(rounds):
            for side in ("ab" if i % 2 == 0 else "ba"):
                rows[side].append(one(procs[side]))
        for proc in procs.values():
            proc.stdin.close()
            proc.wait(timeout=30)
    out = {f"{side}_{k}": round(statistics.median(r[k] for r in rows[side]), 2) for side in "ab" for k in FIGURES}
    ratios = sorted(b["step_ms"] / a["step_ms"] for a, b in zip(rows["a"], rows["b"]))
    out["ratio"] = round(statistics.median(ratios), 3)
    out["ratio_iqr"] = [round(pct(ratios, 25), 3), round(pct(ratios, 75), 3)]  # the resolution of this run
    out["rounds"] = rounds
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", nargs="?", help="the baseline revision")
    parser.add_argument("b", nargs="?", help="the revision to compare (default: the work tree)")
    parser.add_argument("--modes", default="embedded,hosted")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve(args.serve)
    if not args.a:
        parser.error("give the baseline revision A (e.g. HEAD~1)")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    print(f"load: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    result = {}
    with ExitStack() as stack:
        trees = (checkout(args.a, stack), checkout(args.b, stack))
        for mode in args.modes.split(","):
            result[mode] = compare(mode, trees, args.rounds)
            print(f"[{mode}] A={args.a} B={args.b or 'work tree'}: {json.dumps(result[mode])}", flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
