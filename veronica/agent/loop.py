"""The agent loop: resolve held calls, brief, then model call -> tool calls -> results, until a
final answer, a wait (approval / question), the iteration limit (paused) or the budget breaker."""
from __future__ import annotations

import json
import logging

from django.db import transaction

from veronica import bus, events
from veronica.agent import transcript, waggle_bridge
from veronica.agent.live import LiveSink
from veronica.agent.prompt import system_prompt, wake_brief
from veronica.agent.providers import get_provider
from veronica.agent.providers.base import Cancelled as ProviderCancelled
from veronica.agent.providers.base import ProviderError
from veronica.agent.providers.pricing import usd_for
from veronica.agent.tools import Tool, ToolContext, ToolError, tools_for, truncate
from veronica.agent.tools.swarm import WaitForOperator
from veronica.engine import budget
from veronica.engine.runner import Cancelled, RunContext
from veronica.errors import VeronicaError
from veronica.models import Approval, ApprovalStatus, Member, Phase, PermissionMode, Question, Run, RunOutcome, TurnRole

log = logging.getLogger(__name__)

WAITING = RunOutcome.WAITING
INTERRUPTED = "error: this call was interrupted before it finished (the worker restarted). Check the current state before retrying."


def run_member(member: Member, ctx: RunContext) -> str:
    if member.reload_pending:  # skills / prompt changes apply here, at the run boundary
        Member.objects.filter(pk=member.pk).update(reload_pending=False)
    session = transcript.open_session(member)
    tools = tools_for(member.role)
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
    if not unread and ctx.source != "timer" and not unanswered_brief and not resumed_tools:
        return RunOutcome.DONE  # a wake with nothing to do exits cleanly, no model call
    if unread or ctx.source == "timer":
        brief = wake_brief(member, ctx.source, unread)
        ids = [m.pk for m in unread]
        if unanswered_brief:  # a cancelled run left its brief unanswered: fold it into the new one
            last.content, last.mail_ids = brief, sorted(set(last.mail_ids) | set(ids))
            last.save(update_fields=["content", "mail_ids"])
        else:
            transcript.append(session, TurnRole.USER, brief, mail_ids=ids)
        events.emit(member.space_id, "member.briefed", member=member, source=ctx.source, unread=len(unread))

    provider = get_provider(member.model)
    system = system_prompt(member)
    specs = [t.spec() for t in tools.values()]
    for _ in range(member.max_iterations):
        with transaction.atomic():  # one commit: heartbeat + phase
            ctx.check()
            ctx.phase(Phase.THINKING)
        rows = transcript.turns(session)
        try:
            reply = provider.complete(system, transcript.to_messages(rows), specs, should_stop=ctx.should_stop,
                                      on_event=LiveSink(member, ctx))
        except ProviderCancelled:
            raise Cancelled("model call aborted") from None
        with transaction.atomic():  # one commit: the model's turn, its usage, mail read
            record_usage(member, ctx.run, member.model, reply.usage)
            answer_turn(member, session, rows, reply)
        waggle_bridge.on_model_reply(member, tctx, reply.tool_calls)  # settles replays: used or missed
        if not reply.tool_calls:
            ctx.phase(Phase.READY)
            return RunOutcome.DONE
        for call in reply.tool_calls:
            ctx.check()
            if execute(member, ctx, tools, tctx, {"id": call.id, "name": call.name, "args": call.args}) is WAITING:
                return WAITING
        if budget.check_breaker(member) or budget.is_tripped(member):
            ctx.phase(Phase.PAUSED)
            return RunOutcome.BUDGET
    ctx.phase(Phase.PAUSED)
    events.emit(member.space_id, "run.paused", member=member, reason=f"iteration limit {member.max_iterations} reached")
    return RunOutcome.PAUSED


def answer_turn(member: Member, session, rows, reply) -> None:
    """Persist the model's turn; the mail its brief carried is read from this moment on."""
    calls = [{"id": c.id, "name": c.name, "args": c.args} for c in reply.tool_calls]
    with transaction.atomic(savepoint=False):
        transcript.append(session, TurnRole.ASSISTANT, reply.text, tool_calls=calls, tokens=reply.usage.total)
        brief = next((t for t in reversed(rows) if t.role == TurnRole.USER), None)
        if brief is not None and brief.mail_ids:
            bus.mark_read(member, brief.mail_ids)
        if reply.text:
            events.emit(member.space_id, "agent.text", member=member, text=reply.text[:2000])


def record_usage(member: Member, run: Run, model: str, usage) -> None:
    from django.db.models import F

    usd = usd_for(model, usage)
    with transaction.atomic(savepoint=False):
        budget.meter(member, input_tokens=usage.input, output_tokens=usage.output, cache_read=usage.cache_read,
                     cache_write=usage.cache_write, usd=usd)
        Run.objects.filter(pk=run.pk).update(model_calls=F("model_calls") + 1, tokens=F("tokens") + usage.total)
        # iss14-b: one event per model call, the end of its span in the run trace view (veronica/run_trace.py)
        events.emit(member.space_id, "model.called", member=member, run=run.pk, model=model, input=usage.input,
                    output=usage.output, cached=usage.cache_read, usd=str(usd))


def run_tool(tool: Tool, tctx: ToolContext, args: dict) -> str:
    """Tool errors come back as text the model can read; they never crash the run."""
    try:
        return truncate(tool.fn(tctx, args))
    except (ToolError, VeronicaError) as exc:
        return f"error: {exc}"
    except WaitForOperator:
        raise
    except Exception as exc:  # an unexpected tool bug is still just a tool result
        log.exception("tool %s crashed", tool.name)
        return f"error: {tool.name} failed unexpectedly ({type(exc).__name__}: {exc})"


def execute(member: Member, ctx: RunContext, tools: dict[str, Tool], tctx: ToolContext, call: dict) -> str | None:
    tool = tools.get(call["name"])
    args = call["args"] if isinstance(call["args"], dict) else {}
    if tool is None:
        return persist_result(member, tctx, call, f"error: unknown tool '{call['name']}'; available: {', '.join(sorted(tools))}")
    mode = Member.objects.filter(pk=member.pk).values_list("permission_mode", flat=True).first()  # read per call
    if tool.needs_approval and mode == PermissionMode.DEFAULT:
        return hold_for_approval(member, ctx, call)
    with transaction.atomic(savepoint=False):
        ctx.phase(Phase.EXECUTING, tool.name)
        events.emit(member.space_id, "tool.called", member=member, tool=tool.name, args=_short(args))
    try:
        result = run_tool(tool, tctx, {**args, "_call_id": call["id"]} if tool.name == "ask_operator" else args)
    except WaitForOperator:
        ctx.phase(Phase.WAITING_INPUT)
        return WAITING
    if not tool.mutates and not result.startswith("error:"):
        result += waggle_bridge.after_call(member, tctx, tools, tool.name, args, result)
    elif tool.mutates:
        waggle_bridge.observe(member, tctx, tool.name, args, result, mutates=True)
    return persist_result(member, tctx, call, result)


def persist_result(member: Member, tctx: ToolContext, call: dict, result: str) -> None:
    with transaction.atomic(savepoint=False):
        transcript.append(tctx.session, TurnRole.TOOL, result, tool_call_id=call["id"], tool_name=call["name"])
        events.emit(member.space_id, "tool.result", member=member, tool=call["name"], ok=not result.startswith("error:"),
                    chars=len(result), preview=result[:200])
    return None


def hold_for_approval(member: Member, ctx: RunContext, call: dict) -> str:
    with transaction.atomic():
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
        Approval.objects.filter(pk=approval.pk).update(consumed=True)
        if approval.status == ApprovalStatus.DENIED:
            reason = approval.reason or "no reason given"
            return persist_result(member, tctx, call, f"error: the operator denied this {call['name']} call. Reason: {reason}")
        tool = tools.get(call["name"])
        ctx.phase(Phase.EXECUTING, call["name"])
        return persist_result(member, tctx, call, run_tool(tool, tctx, call["args"]) if tool else f"error: unknown tool {call['name']}")
    question = Question.objects.filter(member=member, tool_call_id=call["id"]).first()
    if question is not None:
        if question.answered_at is None:
            ctx.phase(Phase.WAITING_INPUT)
            return WAITING
        Question.objects.filter(pk=question.pk).update(consumed=True)
        return persist_result(member, tctx, call, f"The operator answered: {question.answer}")
    return persist_result(member, tctx, call, INTERRUPTED)


def _short(args: dict) -> dict:
    text = json.dumps(args, default=str)
    return args if len(text) <= 600 else {"_truncated": text[:600]}
