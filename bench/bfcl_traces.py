"""BFCL v4 multi-turn trajectories for ``bench/replay_eval.py``, built from the public benchmark.

    python bench/bfcl_traces.py --gorilla PATH/berkeley-function-call-leaderboard [--out data/bfcl/trajectories.jsonl.gz]

``PATH`` is a checkout of the Gorilla repository (ShishirPatil/gorilla); only its
``berkeley-function-call-leaderboard`` folder is read. Nothing of it is copied here: its executable
backends (``GorillaFileSystem``, ``TwitterAPI``, ``MessageAPI``, ``TicketAPI``, ``TradingBot``,
``TravelAPI``, ``VehicleControlAPI``, ``MathAPI``) are imported from that checkout at run time
(``MathAPI`` needs ``mpmath``: ``pip install mpmath`` where this script runs).

What it writes, next to ``--out``:

* the trajectories, one JSON object per line in replay_eval's format. For every entry of the four
  multi-turn categories (``base``, ``miss_func``, ``miss_param``, ``long_context``) the involved
  classes are instantiated and loaded with the entry's ``initial_config`` (``long_context`` loads
  them with their long-context padding, as the benchmark does), then the ground-truth calls are
  executed turn by turn on them: each user message of a turn, then for each call one assistant
  message carrying it (``tool_calls: [{id, name, args}]``, positional arguments bound to their
  parameter names) and one tool message whose content is the call's return value as JSON (an
  exception becomes ``"Error during execution: ..."``, as the benchmark's executor reports it),
  then one closing assistant reply with empty text. BFCL's answers hold calls only, no model text:
  the closing reply stands for the request that ends the turn (it counts in the token figures) and
  gives the host's judge nothing to read, so on these traces a replayed step is judged by the
  later calls' arguments alone (booked precision is a lower bound here). A turn whose ground
  truth is empty (a missing function or parameter) is that empty reply alone; a turn with no user
  message (the turn where a missing function arrives) goes straight to its calls.
* ``tools.json``: ``{"read_only": [...], "mutating": [...]}`` over the tools the trajectories call.
  The rule: a tool is *mutating* when a call of it changes the backend's state, seen or declared.
  Seen: the instance's public state (the attributes the benchmark's checker compares, pickled)
  differs after one of its calls, on any entry (a cache a lookup fills or a random generator it
  draws from is not state: ``get_flight_cost`` and ``get_outside_temperature_from_google`` read). Declared: its name says it writes (``DECLARED_MUTATING``: file-system writes and the
  directory change, sends, posts, logins and logouts, orders, bookings, settings), so a writing
  tool whose every call here failed (no state changed) is still declared. Everything else reads.
  Where the two disagree the script says so on stderr. ``cd`` mutates, though the checker keeps
  the working directory private: every later file call resolves against it, and a replayed ``cd``
  would move the model's session behind its back. Logins mutate (the session's state).
* ``README.md``: where the data came from and how the tasks are grouped.

Grouping: BFCL ships each scenario in four near-identical copies, one per category, under the
same index (``multi_turn_base_117``, ``multi_turn_miss_func_117``, ``multi_turn_miss_param_117``,
``multi_turn_long_context_117``: the same questions and initial state, the copies differing by a
withheld function, a withheld parameter supplied in an extra turn, or padded state). Those four
are one task: ``task_id`` is the index and ``trial`` the category (0 base, 1 miss_func,
2 miss_param, 3 long_context), so replay_eval's split by task holds out all four copies together
and no copy of a held-out task is trained on. Different indices that share an initial state
(e.g. 66, 70 and 74) ask different questions: they stay different tasks.
"""
from __future__ import annotations

import argparse
import ast
import copy
import gzip
import importlib
import inspect
import json
import pickle
import random
import sys
from pathlib import Path

CATEGORIES = ["base", "miss_func", "miss_param", "long_context"]  # trial = index in this list

# Names that change state by what they say (see the module docstring's rule). Only names of the
# multi-turn backends; a tool named here that the traces never call is not listed in tools.json.
DECLARED_MUTATING = frozenset({
    # GorillaFileSystem: writes, moves, removes, and the working-directory change
    "cd", "cp", "echo", "mkdir", "mv", "rm", "rmdir", "touch",
    # MessageAPI
    "add_contact", "delete_message", "message_login", "send_message",
    # TwitterAPI
    "authenticate_twitter", "comment", "follow_user", "mention", "post_tweet", "retweet", "unfollow_user",
    # TicketAPI
    "close_ticket", "create_ticket", "edit_ticket", "logout", "resolve_ticket", "ticket_login",
    # TradingBot
    "add_to_watchlist", "cancel_order", "fund_account", "place_order", "remove_stock_from_watchlist",
    "trading_login", "trading_logout", "withdraw_funds",
    # TravelAPI
    "authenticate_travel", "book_flight", "cancel_booking", "contact_customer_support", "purchase_insurance",
    "register_credit_card", "set_budget_limit",
    # VehicleControlAPI
    "activateParkingBrake", "adjustClimateControl", "fillFuelTank", "lockDoors", "pressBrakePedal",
    "releaseBrakePedal", "setCruiseControl", "setHeadlights", "set_navigation", "startEngine",
})

# Calls the benchmark's executor refuses to run (it would reach the host): refused here too.
REFUSED = frozenset({"kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run"})


class BadEntry(ValueError):
    """An entry this script cannot turn into a trajectory (named with its id)."""


def read_jsonl(path: Path) -> dict[str, dict]:
    if not path.exists():
        raise SystemExit(f"bfcl_traces: {path} not found (is --gorilla the berkeley-function-call-leaderboard folder?)")
    with open(path, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return {row["id"]: row for row in rows}


def backend_classes(root: Path) -> tuple[dict[str, type], frozenset[str]]:
    """The benchmark's backend classes by name, imported from the checkout, and the stateless ones."""
    sys.path.insert(0, str(root))
    try:
        cfg = importlib.import_module("bfcl_eval.constants.executable_backend_config")
    except ImportError as exc:
        raise SystemExit(f"bfcl_traces: cannot import the BFCL backends from {root}: {exc}") from exc
    classes = {}
    for name, module in cfg.CLASS_FILE_PATH_MAPPING.items():
        if not name.startswith(("Memory", "WebSearch")):  # not used by the multi-turn categories
            try:
                classes[name] = getattr(importlib.import_module(module), name)
            except ImportError as exc:
                raise SystemExit(f"bfcl_traces: importing {module} failed ({exc}); MathAPI needs mpmath") from exc
    return classes, frozenset(cfg.STATELESS_CLASSES)


def parse_call(text: str) -> tuple[str, list, dict]:
    """``name(a, k=v)`` → (name, positional literals, keyword literals). Literals only: a ground
    truth holding an expression is refused, not evaluated."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise BadEntry(f"not a call: {text!r}") from exc
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise BadEntry(f"not a plain call: {text!r}")
    try:
        args = [ast.literal_eval(a) for a in node.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
    except ValueError as exc:
        raise BadEntry(f"non-literal argument in {text!r}") from exc
    return node.func.id, args, kwargs


def state_of(instance) -> bytes:
    """The instance's state as bytes, to tell whether a call changed it: its public attributes, the
    state the benchmark's own checker compares (a backend's ``__eq__`` skips ``_`` attributes:
    caches, random generators, the file system's working directory)."""
    return pickle.dumps({k: v for k, v in vars(instance).items() if not k.startswith("_")})


class Scenario:
    """The involved backends of one entry, loaded with its initial state."""

    def __init__(self, entry: dict, classes: dict[str, type], stateless: frozenset[str], long_context: bool):
        random.seed(0)  # (the backends seed their own generators; this pins anything else)
        self.methods: dict[str, tuple[object, object]] = {}
        for name in entry["involved_classes"]:
            if name not in classes:
                raise BadEntry(f"{entry['id']}: unknown class {name}")
            instance = classes[name]()
            if name not in stateless:
                instance._load_scenario(copy.deepcopy(entry["initial_config"].get(name, {})), long_context=long_context)
            for attr, method in inspect.getmembers(instance, predicate=inspect.ismethod):
                if not attr.startswith("_"):
                    self.methods[attr] = (instance, method)

    def call(self, text: str) -> tuple[str, dict, str, bool]:
        """Run one ground-truth call: (tool, named args, output as JSON, whether state changed)."""
        name, args, kwargs = parse_call(text)
        if name in REFUSED or name not in self.methods:
            raise BadEntry(f"no such tool in this entry: {text!r}")
        instance, method = self.methods[name]
        try:
            named = dict(inspect.signature(method).bind(*args, **kwargs).arguments)
        except TypeError as exc:
            raise BadEntry(f"arguments do not fit {name}: {text!r} ({exc})") from exc
        before = state_of(instance)
        try:
            result = method(**named)
        except Exception as exc:  # noqa: BLE001 - the benchmark reports a failing call as its output
            result = f"Error during execution: {exc}"
        changed = state_of(instance) != before
        return name, named, json.dumps(result, ensure_ascii=False, default=str), changed


def trajectory(entry: dict, answer: list[list[str]], scenario: Scenario, seen: dict[str, bool]) -> list[dict]:
    """The messages of one entry: its turns with the ground truth executed (see the docstring)."""
    turns = entry["question"]
    if len(turns) != len(answer):
        raise BadEntry(f"{entry['id']}: {len(turns)} turns of questions, {len(answer)} of answers")
    messages: list[dict] = []
    for t, (asked, calls) in enumerate(zip(turns, answer)):
        for m in asked:
            messages.append({"role": "user", "content": m["content"]})
        for k, text in enumerate(calls):
            name, args, out, changed = scenario.call(text)
            seen[name] = seen.get(name, False) or changed
            cid = f"call_{t}_{k}"
            messages.append({"role": "assistant", "content": None,
                             "tool_calls": [{"id": cid, "name": name, "args": args}]})
            messages.append({"role": "tool", "tool_call_id": cid, "name": name, "content": out})
        messages.append({"role": "assistant", "content": ""})  # the reply that ends the turn (no text in BFCL)
    return messages


def tool_kinds(seen: dict[str, bool]) -> dict[str, list[str]]:
    """read_only / mutating over the tools called (the rule in the docstring); disagreements on stderr."""
    for name, changed in sorted(seen.items()):
        if changed and name not in DECLARED_MUTATING:
            print(f"bfcl_traces: {name} changed state but is not declared mutating (taken as mutating)", file=sys.stderr)
        if not changed and name in DECLARED_MUTATING:
            print(f"bfcl_traces: {name} is declared mutating; no call of it here changed state", file=sys.stderr)
    mutating = sorted(n for n, changed in seen.items() if changed or n in DECLARED_MUTATING)
    return {"read_only": sorted(set(seen) - set(mutating)), "mutating": mutating}


def build(root: Path) -> tuple[list[dict], dict[str, list[str]]]:
    data = root / "bfcl_eval" / "data"
    classes, stateless = backend_classes(root)
    rows, seen = [], {}
    for trial, cat in enumerate(CATEGORIES):
        questions = read_jsonl(data / f"BFCL_v4_multi_turn_{cat}.json")
        answers = read_jsonl(data / "possible_answer" / f"BFCL_v4_multi_turn_{cat}.json")
        prefix = f"multi_turn_{cat}_"
        for eid, entry in questions.items():
            if not eid.startswith(prefix) or not eid[len(prefix):].isdigit():
                raise BadEntry(f"unexpected id {eid!r} in {cat}")
            if eid not in answers:
                raise BadEntry(f"{eid}: no ground truth")
            scenario = Scenario(entry, classes, stateless, long_context=cat == "long_context")
            rows.append({"task_id": int(eid[len(prefix):]), "trial": trial, "category": cat, "bfcl_id": eid,
                         "messages": trajectory(entry, answers[eid]["ground_truth"], scenario, seen)})
    rows.sort(key=lambda r: (r["task_id"], r["trial"]))
    return rows, tool_kinds(seen)


README = """# BFCL v4 multi-turn: ground-truth trajectories

Built by `bench/bfcl_traces.py` from the Berkeley Function Calling Leaderboard (ShishirPatil/gorilla,
`berkeley-function-call-leaderboard`, Apache-2.0): the four multi-turn categories' questions and
ground-truth calls, executed on the benchmark's own backends. Not committed; rebuild with the script.

- `trajectories.jsonl.gz`: {n} trajectories, {tasks} tasks (`task_id` = the BFCL index; `trial` =
  category: 0 base, 1 miss_func, 2 miss_param, 3 long_context: the four copies of one scenario),
  {calls} tool calls, {ro} of them read-only. No model text: each turn ends with an empty reply.
- `tools.json`: {n_ro} read-only and {n_mut} mutating tools (the rule is in the script's docstring).
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gorilla", required=True, type=Path,
                    help="the berkeley-function-call-leaderboard folder of a gorilla checkout (or the checkout)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "data" / "bfcl" / "trajectories.jsonl.gz")
    args = ap.parse_args()
    root = args.gorilla.resolve()
    if not (root / "bfcl_eval").is_dir() and (root / "berkeley-function-call-leaderboard" / "bfcl_eval").is_dir():
        root = root / "berkeley-function-call-leaderboard"
    try:
        rows, kinds = build(root)
    except BadEntry as exc:
        raise SystemExit(f"bfcl_traces: {exc}") from exc
    args.out.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if args.out.suffix == ".gz" else open
    with opener(args.out, "wt", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    (args.out.parent / "tools.json").write_text(json.dumps(kinds, indent=1) + "\n")
    calls = [c["name"] for r in rows for m in r["messages"] for c in m.get("tool_calls") or []]
    ro = sum(1 for c in calls if c in set(kinds["read_only"]))
    (args.out.parent / "README.md").write_text(README.format(
        n=len(rows), tasks=len({r["task_id"] for r in rows}), calls=len(calls), ro=ro,
        n_ro=len(kinds["read_only"]), n_mut=len(kinds["mutating"])))
    print(f"{len(rows)} trajectories, {len({r['task_id'] for r in rows})} tasks, {len(calls)} calls "
          f"({ro} read-only) -> {args.out}")


if __name__ == "__main__":
    main()
