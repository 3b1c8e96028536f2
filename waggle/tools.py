"""Member-facing tool specs the host can register, plus handlers that turn a call into text.

Specs are plain dicts: ``name``, ``description``, ``parameters`` (JSON schema) and
``mutates`` (False: listing and running read-only routes never change state). The host wires the
handlers to its tool registry and passes its own ``exec`` (with its safety checks and truncation)
to :func:`handle_waggle_run`.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

WAGGLE_LIST = {
    "name": "waggle_list",
    "description": (
        "List this space's waggles: read-only tool routes learned from repeated work, with their "
        "steps ({param} marks a parameter), parameters, usage stats (tokens saved are an estimate) "
        "and whether they are disabled."
    ),
    "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    "mutates": False,
}

WAGGLE_RUN = {
    "name": "waggle_run",
    "description": (
        "Run a waggle (a learned read-only route) by name, with a value for each of its "
        "parameters, and get all of its steps' outputs at once. Use waggle_list to see names "
        "and parameters."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "the waggle's name, as listed by waggle_list"},
            "params": {
                "type": "object",
                "description": "parameter name -> value (strings)",
                "additionalProperties": {"type": "string"},
            },
        },
        "required": ["name"],
        "additionalProperties": False,
    },
    "mutates": False,
}

TOOL_SPECS = [WAGGLE_LIST, WAGGLE_RUN]


def format_list(items: list[dict]) -> str:
    """The text a member sees for waggle_list."""
    if not items:
        return "No waggles yet: routes are learned from read-only tool sequences you repeat."
    lines = []
    for w in items:
        st = w["stats"]
        flag = " [disabled]" if w["disabled"] else ""
        params = ", ".join(w["params"]) or "none"
        lines.append(f"- {w['name']} ({w['scope']}){flag}: params: {params}; used {st['uses']}x, "
                     f"~{st['est_tokens_saved']} tokens saved (estimate), {st['fails']} failures")
        for i, step in enumerate(w["steps"], 1):
            lines.append(f"    {i}. {step}")
    return "\n".join(lines)


def handle_waggle_list(space_key: str, args: Mapping[str, Any] | None = None) -> str:
    from waggle.service import list_waggles

    return format_list(list_waggles(space_key))


def handle_waggle_run(space_key: str, args: Mapping[str, Any], exec) -> str:
    """Run the named waggle. ``params`` may arrive as an object or as a JSON string (hosts that
    flatten arguments to strings). Raises waggle.service.WaggleError with a clear message."""
    from waggle.service import WaggleError, run_waggle

    name = (args or {}).get("name")
    if not isinstance(name, str) or not name.strip():
        raise WaggleError("waggle_run needs 'name' (a string); see waggle_list")
    params = (args or {}).get("params") or {}
    if isinstance(params, str):
        try:
            params = json.loads(params) if params.strip() else {}
        except ValueError as exc:
            raise WaggleError(f"waggle_run 'params' must be an object of strings: {exc}") from exc
    if not isinstance(params, Mapping):
        raise WaggleError("waggle_run 'params' must be an object of strings")
    return run_waggle(space_key, name.strip(), {str(k): str(v) for k, v in params.items()}, exec)
