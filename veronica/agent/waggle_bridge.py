"""The runtime's side of waggle: hand it every call to observe, and an exec that runs a replayed
step through the same tool code, safety checks and truncation as a model-driven call.
waggle never imports veronica; everything crosses as strings, dicts and callables."""
from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

from veronica.agent.tools.base import S, Tool, ToolContext, ToolError, truncate
from veronica.plumbing.errors import VeronicaError, check_tree

if TYPE_CHECKING:
    from veronica.models import Member, Session

log = logging.getLogger(__name__)


def _keys(member: "Member", tctx: ToolContext) -> tuple[str, str, str]:
    return str(member.space_id), str(tctx.session.pk if tctx.session else 0), str(member.pk)


def _flat(args: dict) -> dict:
    """The model's arguments without the runtime's private keys; values keep their JSON types."""
    return {str(k): v for k, v in args.items() if not str(k).startswith("_")}


def read_ahead(starts: list[tuple["Member", "Session"]]) -> dict[int, object]:
    """waggle's view of these members' sessions, read for all at once (veronica.agent.read_ahead): by
    session id, each to be passed to its run's pinned(). Best effort: {} when the read failed."""
    try:
        from waggle import service

        keys = {(str(member.space_id), str(session.pk)): session.pk for member, session in starts}
        return {keys[key]: seen for key, seen in service.read_ahead(list(keys)).items()}
    except Exception:  # best effort: each run reads its own
        log.warning("waggle read-ahead failed", exc_info=True)
        return {}


@contextmanager
def pinned(member: "Member", tctx: ToolContext, *, new: bool = False, seen: object = None) -> Iterator[None]:
    """For the length of a run, which holds the member's slot: waggle may trust its view of the session.
    ``new``: this run created the session (waggle then knows it empty without reading it). ``seen``:
    waggle's view of it read ahead (read_ahead). When the run ends (however: answered, stopped, failed,
    waiting), a replayed step no reply drew on is booked unused."""
    try:
        from waggle import service

        space_key, session_key, _ = _keys(member, tctx)
        # an old session's ring is read now, before the run's first fence (waggle.recording.sync_now)
        pin = service.pinned(space_key, session_key, new=new, sync=not new, seen=seen)
    except Exception:  # best effort
        log.warning("waggle pin failed", exc_info=True)
        yield
        return
    with pin:
        try:
            yield
        finally:
            service.end_run(space_key, session_key)  # never raises; no statement when nothing fired


def make_exec(tctx: ToolContext, tools: dict[str, Tool]):
    def exec_step(name: str, args: dict) -> str:
        tool = tools.get(name)
        if tool is None or tool.mutates:
            raise ToolError(f"waggle may only replay read-only tools; '{name}' is not one")
        return truncate(tool.fn(tctx, dict(args)))  # raises on a tool error: waggle records a failure
    return exec_step


def reaches_out(tools: dict[str, Tool]):
    """For waggle: which tools reach outside the space (an unknown tool is taken to)."""
    def check(name: str) -> bool:
        tool = tools.get(name)
        return tool is None or bool(tool.reaches_out)
    return check


def observe(member: "Member", tctx: ToolContext, name: str, args: dict, output: str, *, mutates: bool) -> None:
    try:
        from waggle import service

        space_key, session_key, member_key = _keys(member, tctx)
        service.observe(space_key, session_key, member_key, name, _flat(args), mutates, output)
    except Exception:  # best effort: waggle never fails a turn
        log.warning("waggle observe failed", exc_info=True)


def after_call(member: "Member", tctx: ToolContext, tools: dict[str, Tool], name: str, args: dict, output: str) -> str:
    """Observe a read-only call; if a stored route continues from here, return its replay block."""
    observe(member, tctx, name, args, output, mutates=False)
    try:
        from waggle import service

        space_key, session_key, _ = _keys(member, tctx)
        block = service.follow(space_key, session_key, make_exec(tctx, tools), reaches_out=reaches_out(tools))
    except Exception:
        log.warning("waggle follow failed", exc_info=True)
        return ""
    if not block:
        return ""
    from veronica.swarm import events

    events.emit(member.space_id, "waggle.replayed", member=member, after=name, chars=len(block))
    return "\n\n" + block


def before_inbound(member: "Member", tctx: ToolContext, tools: dict[str, Tool], text: str) -> str | None:
    """Before the transaction that writes the brief: waggle reads what on_inbound needs (nothing for a
    new session of a space whose routes it holds). If the space has an inbound route, the message is
    heard now, outside that transaction (a replay runs a tool: it holds no lock meanwhile) and its
    block returned; None: call on_inbound inside the transaction, where the message's row rides in
    its last statement."""
    if not text:
        return ""
    try:
        from waggle import service

        space_key, session_key, _ = _keys(member, tctx)
        hears = service.ready(space_key, session_key)
    except Exception:  # best effort: waggle never fails a turn
        log.warning("waggle ready failed", exc_info=True)
        hears = True
    return on_inbound(member, tctx, tools, text) if hears else None


def on_inbound(member: "Member", tctx: ToolContext, tools: dict[str, Tool], text: str) -> str:
    """The mail that woke the member, before the model reads it: waggle records it and, if a learned
    call takes its argument from such a message, replays it; returns the block to append to the brief.
    Called by before_inbound, or inside the brief's fence when it says so (the row then commits with the brief)."""
    if not text:
        return ""
    try:
        from waggle import service

        space_key, session_key, member_key = _keys(member, tctx)
        block = service.inbound(space_key, session_key, member_key, text, make_exec(tctx, tools))
    except Exception:  # best effort: waggle never fails a turn
        log.warning("waggle inbound failed", exc_info=True)
        return ""
    if not block:
        return ""
    from veronica.swarm import events

    events.emit(member.space_id, "waggle.replayed", member=member, after="inbound mail", chars=len(block))
    return "\n\n" + block


def on_model_reply(member: "Member", tctx: ToolContext, tool_calls, text: str | None = "") -> None:
    """The model's reply after tool results arrived: judge the session's replays (a replayed step
    is used when the reply's text or calls draw on what it returned, a miss when the model issues
    it again itself)."""
    try:
        from waggle import service

        space_key, session_key, _ = _keys(member, tctx)
        calls = [(c.name, _flat(c.args if isinstance(c.args, dict) else {})) for c in (tool_calls or [])]
        service.judge_reply(space_key, session_key, calls, text=text or "")
    except Exception:  # best effort: waggle never fails a turn
        log.warning("waggle judge_reply failed", exc_info=True)


def _waggle_list(tctx: ToolContext, args: dict) -> str:
    from waggle import service

    rows = service.list_waggles(str(tctx.space.pk))
    if not rows:
        return "(no waggles yet: repeated read-only routes are learned automatically)"
    return "\n".join(str(row) for row in rows)


def _waggle_run(tctx: ToolContext, args: dict) -> str:
    from waggle import service

    params = args.get("params") or {}
    if not isinstance(params, dict):
        raise ToolError("params must be an object of name → value")
    name, params = str(args.get("name", "")), {str(k): v for k, v in params.items()}  # values keep their JSON types
    try:  # before any lookup: PostgreSQL refuses such text
        check_tree({"name": name, "params": params}, what="the arguments")
    except VeronicaError as exc:
        raise ToolError(f"argument '{exc.field}': {exc.message}") from None
    tools = tctx.tools  # the run's own table (listed at its boundary): MCP read-only tools replay too
    if tools is None:
        raise ToolError("waggle_run replays a route through a run's tools; this call has no run")
    try:
        return service.run_waggle(str(tctx.space.pk), name, params, make_exec(tctx, tools),
                                  reaches_out=reaches_out(tools))
    except ToolError:
        raise
    except Exception as exc:
        raise ToolError(str(exc)) from None


def tools() -> list[Tool]:
    return [
        Tool("waggle_list", "List the team's learned read-only routes (waggles) with their stats.", _waggle_list),
        Tool("waggle_run", "Run a learned route on demand with bound parameters.", _waggle_run,
             {"name": S, "params": {"type": "object"}}, ("name",)),
    ]
