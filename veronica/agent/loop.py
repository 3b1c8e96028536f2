"""The agent loop: resolve held calls, brief, then model call -> tool calls -> results, until a
final answer, a wait (approval / question), the iteration limit (paused) or the budget breaker.

Every write goes through `ctx.fenced()` (veronica.agent.runctx): a run that lost its lease writes
nothing more and stops. Replies that are not answers are not taken for one: an empty reply is asked
again once and is then an error; a reply cut off at the token limit is kept as a partial answer and
the model is asked to continue (twice at most, then the run fails: the limit is too low for the work).
"""
from __future__ import annotations

import json
import logging

from django.db import transaction
from django.db.models.functions import Now

from veronica import bus, events, tracing
from veronica.agent import compaction, metering, transcript, waggle_bridge
from veronica.agent.live import LiveSink
from veronica.agent.prompt import system_prompt, wake_brief
from veronica.agent.providers import get_provider
from veronica.agent.providers.base import Cancelled as ProviderCancelled
from veronica.agent.providers.base import Provider, ProviderError, Reply
from veronica.agent.runctx import Cancelled, RunContext
from veronica.agent.tools import Tool, ToolContext, ToolError, tools_for, truncate, workspace
from veronica.agent.tools.mcp import McpTool
from veronica.agent.tools.swarm import WaitForOperator
from veronica.errors import VeronicaError
from veronica.models import Approval, ApprovalStatus, Member, Phase, PermissionMode, Question, RunOutcome, TurnRole

log = logging.getLogger(__name__)

__all__ = ["Cancelled", "run_member"]

WAITING = RunOutcome.WAITING
INTERRUPTED = "error: this call was interrupted before it finished (the worker restarted). Check the current state before retrying."
INTERRUPTED_APPROVED = ("error: this approved {tool} call was interrupted while it ran (the worker restarted); it may or may not "
                        "have taken effect, and it was not run again. Check the current state; a new call needs a new approval.")
OVER_BUDGET = "error: not run: the daily token budget tripped before this call could run."
CONTINUE = "Your reply was cut off at the output token limit. Continue exactly where it stopped."
EMPTY_RETRIES = 1
MAX_CONTINUATIONS = 2
# Workspace tools touch files, never the DB, and run_command may take 30 s: they run beside the
# run's thread while the lease is renewed. Every other tool writes rows and runs inside the fence.
LOCAL_TOOLS = frozenset(t.name for t in workspace.TOOLS)


def run_member(member: Member, ctx: RunContext) -> str:
    with ctx.fenced():
        if member.reload_pending:  # skills / prompt changes apply here, at the run boundary
            Member.objects.filter(pk=member.pk).update(reload_pending=False)
        session = transcript.open_session(member)
    tools = tools_for(member)  # with the MCP servers' tools, listed at the run boundary
    tctx = ToolContext(member=member, space=member.space, session=session, run=ctx.run)
    rows = transcript.turns(session)

    for call in transcript.dangling_calls(rows):
        result = resolve_held(member, ctx, tools, tctx, call)
        if result is WAITING:
            return WAITING
    rows = transcript.turns(session)

    unread = list(bus.unread_for(member))
    last = rows[-1] if rows else None
    unanswered_brief = last is not None and last.role == TurnRole.USER
    resumed_tools = bool(rows) and rows[-1].role == TurnRole.TOOL
    if resumed_tools and ctx.source != "timer":
        unread = []  # finish the interrupted chain first, as the run would have; the new mail gets the next run
    if not unread and ctx.source != "timer" and not unanswered_brief and not resumed_tools:
        return RunOutcome.DONE  # a wake with nothing to do exits cleanly, no model call
    if unread or ctx.source == "timer":
        brief = wake_brief(member, ctx.source, unread)
        ids = [m.pk for m in unread]
        with ctx.fenced():
            if unanswered_brief:  # a stopped or failed run left its brief unanswered: fold it into the new one
                last.content = brief if last.mail_ids else f"{last.content}\n\n{brief}"
                last.mail_ids = sorted(set(last.mail_ids) | set(ids))
                last.save(update_fields=["content", "mail_ids"])
            else:
                transcript.append(session, TurnRole.USER, brief, mail_ids=ids)
            events.emit(member.space_id, "member.briefed", member=member, source=ctx.source, unread=len(unread))

    provider = get_provider(member.model)
    system = system_prompt(member)
    specs = [t.spec() for t in tools.values()]
    empties = cuts = 0
    for _ in range(member.max_iterations):
        ctx.check()
        ctx.phase(Phase.THINKING, step=True)
        session, rows = compaction.maybe_compact(member, ctx, session, transcript.turns(session), system, specs, provider)
        tctx.session = session
        reply, tripped = call_model(ctx, provider, system, transcript.to_messages(rows), specs)
        if reply.empty:
            if tripped:  # nothing to keep: the brief stays unanswered for the next day's run
                return stop_for_budget(member, ctx, tctx, reply)
            empties += 1
            if empties > EMPTY_RETRIES:
                raise ProviderError(f"the model returned {empties} empty replies in a row (no text, no tool calls)")
            with ctx.fenced():
                events.emit(member.space_id, "agent.empty_reply", member=member, finish_reason=reply.finish_reason)
            continue
        empties = 0
        if reply.truncated:
            cuts += 1
            if cuts > MAX_CONTINUATIONS:
                raise ProviderError(f"the reply was cut off at the output token limit {cuts} times in a row; "
                                    "raise the model's max tokens", permanent=True)
            reply = Reply(text=reply.text, usage=reply.usage, finish_reason=reply.finish_reason)  # cut calls are not run
        else:
            cuts = 0
        with ctx.fenced():  # one commit: the model's turn and the mail it answered
            answer_turn(member, session, rows, reply)
            if reply.truncated:  # not a final answer: the next call (or the next run) continues it
                transcript.append(session, TurnRole.USER, CONTINUE)
        waggle_bridge.on_model_reply(member, tctx, reply.tool_calls)  # settles replays: used or missed
        if tripped:
            return stop_for_budget(member, ctx, tctx, reply)
        if reply.truncated:
            continue
        if not reply.tool_calls:
            ctx.phase(Phase.READY)
            return RunOutcome.DONE
        for call in reply.tool_calls:
            ctx.check()
            if execute(member, ctx, tools, tctx, {"id": call.id, "name": call.name, "args": call.args}) is WAITING:
                return WAITING
    with ctx.fenced():
        ctx.phase(Phase.PAUSED)
        events.emit(member.space_id, "run.paused", member=member, reason=f"iteration limit {member.max_iterations} reached")
    return RunOutcome.PAUSED


def call_model(ctx: RunContext, provider: Provider, system: str, messages: list[dict], specs: list[dict]) -> tuple[Reply, bool]:
    """One metered model call. Failed calls are metered too; the breaker is checked after every one."""
    member = ctx.member
    try:
        reply = tracing.complete(provider, member.model, system, messages, specs, should_stop=ctx.should_stop,  # a chat span
                                  on_event=LiveSink(member, ctx))
    except ProviderCancelled:
        raise ctx.stop_reason() from None
    except ProviderError as exc:
        metering.record(ctx, member.model, exc.usage)
        raise
    reply = metering.with_usage(reply, system, messages, specs)
    return reply, metering.record(ctx, member.model, reply.usage)


def stop_for_budget(member: Member, ctx: RunContext, tctx: ToolContext, reply: Reply) -> str:
    """Over budget right after a model call: its tool calls are answered, not run."""
    with ctx.fenced():
        for call in reply.tool_calls:
            persist_result(member, tctx, {"id": call.id, "name": call.name}, OVER_BUDGET)
        ctx.phase(Phase.PAUSED)
    return RunOutcome.BUDGET


def answer_turn(member: Member, session, rows, reply: Reply) -> None:
    """Persist the model's turn; the mail its brief carried is read from this moment on."""
    calls = [{"id": c.id, "name": c.name, "args": c.args} for c in reply.tool_calls]
    transcript.append(session, TurnRole.ASSISTANT, reply.text, tool_calls=calls, tokens=reply.usage.total,
                      input_tokens=reply.usage.input)  # the last turn's input, shown in the member view
    brief = next((t for t in reversed(rows) if t.role == TurnRole.USER), None)
    if brief is not None and brief.mail_ids:
        bus.mark_read(member, brief.mail_ids)
    if reply.text:
        events.emit(member.space_id, "agent.text", member=member, text=reply.text[:2000], truncated=reply.truncated)


@tracing.traced_tool  # an execute_tool span per call
def run_tool(tool: Tool, tctx: ToolContext, args: dict, *, savepoint: bool = True):
    """Tool errors come back as text the model can read; they never crash the run. A tool that
    writes rows runs in a savepoint, so a failing one leaves nothing half-written; ask_operator's
    WaitForOperator is returned (not raised) so its question survives the savepoint."""
    try:
        if not savepoint:
            return truncate(tool.fn(tctx, args))
        with transaction.atomic():
            try:
                return truncate(tool.fn(tctx, args))
            except WaitForOperator as wait:
                return wait
    except (ToolError, VeronicaError) as exc:
        return f"error: {exc}"
    except Exception as exc:  # an unexpected tool bug is still just a tool result
        log.exception("tool %s crashed", tool.name)
        return f"error: {tool.name} failed unexpectedly ({type(exc).__name__}: {exc})"


def execute(member: Member, ctx: RunContext, tools: dict[str, Tool], tctx: ToolContext, call: dict) -> str | None:
    tool = tools.get(call["name"])
    args = call["args"] if isinstance(call["args"], dict) else {}
    if tool is None:
        with ctx.fenced():
            return persist_result(member, tctx, call, f"error: unknown tool '{call['name']}'; available: {', '.join(sorted(tools))}")
    mode = Member.objects.filter(pk=member.pk).values_list("permission_mode", flat=True).first()  # read per call
    if tool.needs_approval and mode == PermissionMode.DEFAULT:
        return hold_for_approval(member, ctx, call)
    with ctx.fenced():
        ctx.phase(Phase.EXECUTING, tool.name, step=True)
        events.emit(member.space_id, "tool.called", member=member, tool=tool.name, args=_short(args))
    return run_and_persist(member, ctx, tools, tctx, tool, call, args)


def run_and_persist(member: Member, ctx: RunContext, tools: dict[str, Tool], tctx: ToolContext, tool: Tool, call: dict,
                    args: dict, *, consume=None) -> str | None:
    """Run one call and persist its result under the lease (with `consume`, the held decision it used)."""
    if tool.name in LOCAL_TOOLS:
        result = ctx.keep_alive(lambda: run_tool(tool, tctx, args, savepoint=False))
        with ctx.fenced():
            if consume:
                consume()
            return persist_result(member, tctx, call, observe(member, tctx, tools, tool, args, result))
    with ctx.fenced():  # a row-writing tool: its effects and its result commit together, or not at all
        if consume:
            consume()
        result = run_tool(tool, tctx, {**args, "_call_id": call["id"]} if tool.name == "ask_operator" else args)
        if isinstance(result, WaitForOperator):
            ctx.phase(Phase.WAITING_INPUT)
            return WAITING
        return persist_result(member, tctx, call, observe(member, tctx, tools, tool, args, result))


def observe(member: Member, tctx: ToolContext, tools: dict[str, Tool], tool: Tool, args: dict, result: str) -> str:
    if not tool.mutates and not result.startswith("error:"):
        return result + waggle_bridge.after_call(member, tctx, tools, tool.name, args, result)
    if tool.mutates:
        waggle_bridge.observe(member, tctx, tool.name, args, result, mutates=True)
    return result


def persist_result(member: Member, tctx: ToolContext, call: dict, result: str) -> None:
    """Callers hold the run's fence."""
    transcript.append(tctx.session, TurnRole.TOOL, result, tool_call_id=call["id"], tool_name=call["name"])
    events.emit(member.space_id, "tool.result", member=member, tool=call["name"], ok=not result.startswith("error:"),
                chars=len(result), preview=result[:200])
    return None


def hold_for_approval(member: Member, ctx: RunContext, call: dict) -> str:
    with ctx.fenced():
        approval, created = Approval.objects.get_or_create(
            member=member, tool_call_id=call["id"],
            defaults={"space_id": member.space_id, "tool_name": call["name"], "tool_args": call["args"]})
        if created:
            events.emit(member.space_id, "approval.requested", member=member, approval=approval.pk, tool=call["name"],
                        args=_short(call["args"]))
        ctx.phase(Phase.WAITING_APPROVAL, call["name"])
    return WAITING


def resolve_held(member: Member, ctx: RunContext, tools: dict[str, Tool], tctx: ToolContext, call: dict) -> str | None:
    """A call left without a result: decided approval, answered question, or an interrupted call."""
    approval = Approval.objects.filter(member=member, tool_call_id=call["id"]).first()
    if approval is not None:
        if approval.status == ApprovalStatus.PENDING:
            ctx.phase(Phase.WAITING_APPROVAL, call["name"])
            return WAITING

        tracing.event("approval.resolved", approval=approval.pk, tool=call["name"], status=approval.status)

        def consume() -> None:
            Approval.objects.filter(pk=approval.pk).update(consumed=True)
        if approval.status == ApprovalStatus.DENIED:
            reason = approval.reason or "no reason given"
            with ctx.fenced():
                consume()
                return persist_result(member, tctx, call, f"error: the operator denied this {call['name']} call. Reason: {reason}")
        tool = tools.get(call["name"])
        if tool is None:
            with ctx.fenced():
                consume()
                return persist_result(member, tctx, call, f"error: unknown tool {call['name']}")
        args = call["args"] if isinstance(call["args"], dict) else {}
        if not start_approved(member, ctx, approval, tool):  # it began once and the worker died: not twice
            with ctx.fenced():
                consume()
                events.emit(member.space_id, "approval.interrupted", member=member, approval=approval.pk, tool=call["name"])
                return persist_result(member, tctx, call, INTERRUPTED_APPROVED.format(tool=call["name"]))
        ctx.phase(Phase.EXECUTING, call["name"], step=True)
        return run_and_persist(member, ctx, tools, tctx, tool, call, args, consume=consume)
    question = Question.objects.filter(member=member, tool_call_id=call["id"]).first()
    if question is not None:
        if question.answered_at is None:
            ctx.phase(Phase.WAITING_INPUT)
            return WAITING
        with ctx.fenced():
            Question.objects.filter(pk=question.pk).update(consumed=True)
            return persist_result(member, tctx, call, f"The operator answered: {question.answer}")
    tool = tools.get(call["name"])
    if tool is not None and rerun_is_safe(tool):  # it never took effect (rolled back) or it only reads
        return execute(member, ctx, tools, tctx, call)
    with ctx.fenced():
        return persist_result(member, tctx, call, INTERRUPTED)


def escapes_the_fence(tool: Tool) -> bool:
    """Its effects live outside the run's transaction (files, commands, an MCP server): a crash
    during it cannot roll them back."""
    return tool.name in LOCAL_TOOLS or isinstance(tool, McpTool)


def rerun_is_safe(tool: Tool) -> bool:
    return not tool.mutates or not escapes_the_fence(tool)


def start_approved(member: Member, ctx: RunContext, approval: Approval, tool: Tool) -> bool:
    """Before an approved call that escapes the fence runs, commit that it began. False when an earlier
    run already began it (and died before its result): running it again could apply it twice."""
    if not escapes_the_fence(tool) or not tool.mutates:
        return True
    with ctx.fenced():
        return bool(Approval.objects.filter(pk=approval.pk, started_at__isnull=True).update(started_at=Now()))


def _short(args: dict) -> dict:
    text = json.dumps(args, default=str)
    return args if len(text) <= 600 else {"_truncated": text[:600]}
