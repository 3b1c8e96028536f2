"""Plain helpers shared by waggle's tests (imported as a module; fixtures live in conftest.py)."""
from __future__ import annotations

import json

from waggle import service


class FakeExec:
    """The host's exec: records every call and answers from a table (or a default text)."""

    def __init__(self, answers=None, fail_on=None, empty_on=None):
        self.calls: list[tuple[str, dict]] = []
        self.answers = answers or {}
        self.fail_on = set(fail_on or ())
        self.empty_on = set(empty_on or ())

    def __call__(self, tool: str, args: dict) -> str:
        self.calls.append((tool, dict(args)))
        if tool in self.fail_on:
            raise RuntimeError(f"tool {tool} exploded")
        if tool in self.empty_on:
            return "  \n"
        return self.answers.get(tool, f"output of {tool} {sorted(args.items())}")


def routine(module: str) -> list[tuple[str, dict]]:
    """A typical read-only routine: two trigger steps bound to ``module``, then three more."""
    return [
        ("list_dir", {"path": module}),
        ("grep", {"path": module, "pattern": "TODO"}),
        ("read_file", {"path": module}),
        ("git_log", {"path": module, "limit": 5}),
        ("blackboard_read", {}),
    ]


def feed(space_key, session_key, calls, config, member_key="m1", mutates=False):
    """Observe each (tool, args) as the host would after running it."""
    for tool, args in calls:
        service.observe(space_key, session_key, member_key, tool, args, mutates,
                        f"out:{tool}:{sorted(args.items())}", config=config)


def noise(i: int) -> list[tuple[str, dict]]:
    """A read-only call that never repeats (breaks nothing, joins no route)."""
    return [(f"noise_{i}", {"n": i})]


def teach_heard(space, users, config):
    """Sessions where the message names a user id and the agent looks it up first: an inbound route."""
    for i, u in enumerate(users):
        s = f"teach-{i}"
        service.inbound(space, s, "m", f"Hello, my user id is {u}.", None, config=config)
        service.observe(space, s, "m", "get_user_details", {"user_id": u}, False, json.dumps({"id": u}), config=config)
        service.observe(space, s, "m", "cancel", {"user_id": u}, True, "ok", config=config)
    w = service.sweep(space, config=config)
    assert w is not None and w.name.startswith("heard.")
    return w
