"""The agent loop: resolve held calls, brief, then model call -> tool calls -> results, until a
final answer, a wait (approval / question), the iteration limit (paused) or the budget breaker.

Every write goes through `ctx.fenced()` (veronica.agent.runctx): a run that lost its lease writes
nothing more and stops. A step whose calls all run inside the run's transaction anyway (row-writing
verbs) or are bounded local reads (read_file, list_dir) is one commit: the call's usage, the model's
turn, the results and the next phase (see fusable()); other calls keep the two-commit step (the
turn with the first call's start, then each result). Replies that are not answers are not taken
for one: an empty reply is asked again once and is then an error; a reply cut off at the token
limit is kept as a partial answer and the model is asked to continue (twice at most, then the run
fails: the limit is too low for the work).

One file past 500 lines on purpose: it is one state machine (held calls, brief, step, tool calls,
wait), and the order of its fenced writes is the invariant; split, that order would be spread over
modules that each look correct alone.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import re
import uuid

from django.db import transaction
from django.db.models.functions import Now

from veronica.swarm import bus, chat, events
from veronica.ops import tracing
from veronica.agent import compaction, metering, runstart, transcript, waggle_bridge
from veronica.agent.live import LiveSink
from veronica.agent.prompt import system_prompt, wake_brief
from veronica.agent.providers import get_provider, member_key, provider_for, sdk
from veronica.agent.providers.base import Cancelled as ProviderCancelled
from veronica.agent.providers.base import Provider, ProviderError, Reply, ToolCall
from veronica.agent.runctx import Cancelled, RunContext
from veronica.agent.tools import Tool, ToolContext, ToolError, deferred_of, tools_for, truncate, workspace
from veronica.agent.tools import a2a as a2a_tools
from veronica.agent.tools.a2a import A2ATool
from veronica.agent.tools.mcp import NAME_LIMIT as MCP_NAME_LIMIT
from veronica.agent.tools.mcp import McpTool
from veronica.agent.tools.swarm import WaitForOperator
from veronica.engine import approvals as approval_verbs
from veronica.plumbing.errors import VeronicaError, storable
from veronica.models import Approval, ApprovalStatus, Member, Phase, PermissionMode, Question, RunOutcome, TurnRole
from veronica.plumbing.secret_store import mask

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
# A bounded read (at most MAX_READ_BYTES of one regular file) runs on the run's own thread: a helper
# thread costs two thread hand-offs per step, a third of a step on a loaded host. The lease (60 s)
# outlasts it by far, and the result's fence still checks it.
INLINE_TOOLS = frozenset({"read_file"})
# Bounded local reads that may run inside the model turn's transaction (see fusable()).
FUSED_LOCAL_TOOLS = frozenset({"read_file", "list_dir"})
# Row-writing verbs that still keep their own commit: waggle_run replays a route, whose steps may be
# MCP calls or searches (neither bounded nor local).
UNFUSED_VERBS = frozenset({"waggle_run"})


def run_member(member: Member, ctx: RunContext) -> str:
    # The engine's claim may have read (or opened) the open session already, in its own statement.
    session = getattr(ctx, "session", None) or transcript.current_session(member)  # the slot keeps other runs from writing it
    if session is None:
        with ctx.fenced():
            session = transcript.new_session(member)
            session.fresh = True
    new = getattr(session, "fresh", False)  # opened for this run: no turn to read, and nothing of waggle's yet
    with runstart.known(getattr(session, "start_empty", frozenset())):  # what the claim found none of (until the first call)
        tools = tools_for(member)  # with the MCP servers' tools, listed at the run boundary
        ahead = getattr(ctx, "ahead", None)  # read with other runs' by the engine (veronica.agent.read_ahead), or None
        if ahead is not None:
            ctx.ahead = None
        log_ = transcript.Log(session, [] if new else ahead.turns if ahead is not None else None)  # in memory for the whole run
        tctx = ToolContext(member=member, space=member.space, session=session, run=ctx.run, log=log_, tools=tools)
        seen = ahead.waggle if ahead is not None else None
        with waggle_bridge.pinned(member, tctx, new=new, seen=seen):  # the run holds the slot: waggle may trust its view of the session
            return run_steps(member, ctx, tools, tctx)


def run_steps(member: Member, ctx: RunContext, tools: dict[str, Tool], tctx: ToolContext) -> str:
    log_, session = tctx.log, tctx.session
    held = transcript.dangling_calls(log_.rows)
    for call in held:
        result = resolve_held(member, ctx, tools, tctx, call)
        if result is WAITING:
            return WAITING
    rows = log_.rows

    unread = getattr(ctx, "unread", None)  # the engine's claim read the mailbox (PostgreSQL), in its own statement
    if unread is not None:
        ctx.unread = None  # read once: at this run's start
    if unread is None or held:  # (a held call that ran since may have changed it)
        unread = bus.unread_list(member)
    last = rows[-1] if rows else None
    unanswered_brief = last is not None and last.role == TurnRole.USER
    resumed_tools = bool(rows) and rows[-1].role == TurnRole.TOOL
    if resumed_tools and ctx.source != "timer":
        unread = []  # finish the interrupted chain first, as the run would have; the new mail gets the next run
    if not unread and ctx.source != "timer" and not unanswered_brief and not resumed_tools:
        if member.phase == Phase.THINKING:  # set for it ahead (a worker's resumes, veronica.engine.runner.read_ahead)
            ctx.phase(Phase.READY)
        return RunOutcome.DONE  # a wake with nothing to do exits cleanly, no model call
    if unanswered_brief and ctx.source == "resume" and unread and sorted(m.pk for m in unread) == sorted(last.mail_ids):
        # A cut run (its worker died, its lease ran out) left this brief unanswered, with this very mail:
        # it is sent again as it was, so the request is the one the cut run made, whose answer the host's
        # model gateway may still hold for this member (veronica.agent.providers.gateway).
        next_phase(ctx, Phase.THINKING)
    elif unread or ctx.source == "timer":
        brief = wake_brief(member, ctx.source, unread)
        # the mail is the message that woke the member: waggle records it and may replay a call it names
        # (then before the fence: a replay runs a tool); else its row rides in the brief's commit
        mail = "\n\n".join(f"{m.subject}\n{m.body}" if m.subject else m.body for m in unread)
        heard = waggle_bridge.before_inbound(member, tctx, tools, mail)
        ids = [m.pk for m in unread]
        next_phase(ctx, Phase.THINKING)  # the first model call's phase rides the brief's fence: no commit of its own
        with ctx.fenced(), log_.batched():  # the brief's turn rides the fence's event statement (PostgreSQL)
            brief += heard if heard is not None else waggle_bridge.on_inbound(member, tctx, tools, mail)
            if unanswered_brief:  # a stopped or failed run left its brief unanswered: fold it into the new one
                last.content = brief if last.mail_ids else f"{last.content}\n\n{brief}"
                last.mail_ids = sorted(set(last.mail_ids) | set(ids))
                last.save(update_fields=["content", "mail_ids"])
            else:
                log_.append(TurnRole.USER, brief, mail_ids=ids)
            events.emit(member.space_id, "member.briefed", member=member, source=ctx.source, unread=len(unread))
        if unanswered_brief:
            log_ = tctx.log = transcript.Log(session, rows)
        else:  # the operator's mail this brief carries, known without a query (chat.record_reply)
            log_.operator_mail = [m for m in unread if m.sender_name == bus.OPERATOR]

    def make(spec: str) -> Provider:  # each model of the chain with the member's key for its vendor, if one is set
        key = None if runstart.empty("secrets") else member_key(member, spec)
        return get_provider(spec, key) if key else get_provider(spec)

    provider = provider_for(member.model, member.fallback, make=make)  # its fallback chain on overload and outage
    system = system_prompt(member, tools)
    runstart.forget()  # the start's reads are done: a tool that writes a row mid-run reads it back
    if hasattr(ctx, "system_prompt"):  # the engine's lease keeps it for the Run row (the prompt inspector)
        ctx.system_prompt = system
    unloaded = deferred_of(member, tools)  # named in the prompt; a tool's schema is sent from its first use
    specs = [t.spec() for name, t in tools.items() if name not in unloaded]
    fixed_chars = len(system) + len(json.dumps(specs))  # what estimate_tokens adds to the messages
    limit = compaction.threshold(member.model)
    empties = cuts = 0
    for _ in range(member.max_iterations):
        ctx.check()
        ctx.phase(Phase.THINKING)  # usually written already, by the previous step's last fence
        if (fixed_chars + log_.chars) // metering.CHARS_PER_TOKEN >= limit:
            session, rows = compaction.maybe_compact(member, ctx, log_.session, log_.rows, system, specs, provider)
            log_ = tctx.log = transcript.Log(session, list(rows))
            tctx.session = session
        reply = call_model(ctx, provider, system, list(log_.messages), specs, chars=fixed_chars + log_.chars)
        if reply.empty:
            if metering.record(ctx, reply.model or member.model, reply.usage):  # nothing to keep: the brief stays unanswered
                return stop_for_budget(member, ctx, tctx, reply)
            empties += 1
            if empties > EMPTY_RETRIES and reply.finish_reason == "content_filter":
                # Refused (Anthropic's stop_reason refusal, OpenAI's content_filter) each time it was
                # asked: the same transcript is refused again, so park with the reason, never retry it.
                raise ProviderError(f"the vendor refused to answer {empties} times in a row (content filter / "
                                    "refusal); change the request or the model, then resume the member", permanent=True)
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
        calls = [] if reply.truncated else reply.tool_calls
        used = {c.name for c in calls} & unloaded
        if used:  # first use of a deferred tool: its schema goes with every later call
            unloaded -= used
            specs = specs + [tools[name].spec() for name in sorted(used)]
            fixed_chars = len(system) + len(json.dumps(specs))
        fuse = bool(calls) and fusable(ctx, tools, calls[0].name)  # judged again on the fence's own read
        first = calls[0] if calls else None
        if fuse:
            pass  # the step ends in the phase it began in (thinking): its fence writes none
        elif first is not None and announceable(ctx, tools, first.name):
            next_phase(ctx, Phase.EXECUTING, first.name)
        elif not reply.tool_calls and not reply.truncated:
            next_phase(ctx, Phase.READY)
        # One commit: the call's usage, the model's turn, the mail it answered; then either the calls
        # that run inside this transaction (a fused step: their results and the next phase too, so a
        # step is one commit) or the first call's start.
        done, waiting, judged = 0, False, False
        used = reply.model or member.model  # the model that answered (a fallback's, after a switch)
        with metering.billed(ctx, used, reply.usage), log_.batched():
            tripped = metering.record(ctx, used, reply.usage)
            answer_turn(member, log_, reply)
            if reply.truncated:  # not a final answer: the next call (or the next run) continues it
                log_.append(TurnRole.USER, CONTINUE)
            if fuse and not tripped and not stopping(ctx):
                waggle_bridge.on_model_reply(member, tctx, reply.tool_calls, reply.text)  # before the results: it settles replays
                done, waiting, judged = *run_fused(member, ctx, tools, tctx, calls), True
            nxt = calls[done] if done < len(calls) and not waiting else None
            announced = nxt is not None and not tripped and announce(member, ctx, tools, nxt)
        if not judged:
            waggle_bridge.on_model_reply(member, tctx, reply.tool_calls, reply.text)  # settles replays: used or missed
        if tripped:
            return stop_for_budget(member, ctx, tctx, reply)
        if waiting:
            return WAITING
        if reply.truncated:
            continue
        if not reply.tool_calls:
            ctx.phase(Phase.READY)
            return RunOutcome.DONE
        for i in range(done, len(calls)):
            call = calls[i]
            ctx.check()
            last_call = i == len(calls) - 1
            if execute(member, ctx, tools, tctx, {"id": call.id, "name": call.name, "args": call.args},
                       announced=announced and i == done, then=Phase.THINKING if last_call else None) is WAITING:
                return WAITING
    with ctx.fenced():
        ctx.phase(Phase.PAUSED)
        events.emit(member.space_id, "run.paused", member=member, reason=f"iteration limit {member.max_iterations} reached")
    return RunOutcome.PAUSED


def fusable(ctx: RunContext, tools: dict[str, Tool], name: str) -> bool:
    """A call that may run inside the model turn's own transaction: it runs in the run's transaction
    anyway (a row-writing verb: its effects commit with its result or not at all) or it is a bounded
    local read (no effect, cannot hang). Its crash window is then the transaction's (milliseconds):
    a crash loses the turn, its usage and the result together, never the result alone. Calls that
    escape the transaction or can take long (workspace writes, run_command, grep/glob, MCP) and calls
    the permission gate holds keep their own commits."""
    tool = tools.get(name)
    if tool is None:
        return True  # an unknown tool's error result
    if tool.name in UNFUSED_VERBS or escapes_the_fence(tool) and tool.name not in FUSED_LOCAL_TOOLS:
        return False
    return not held_by_gate(ctx, tool)


def stopping(ctx: RunContext) -> bool:
    """The fence just read the cancel flag (no statement): a stop asked for runs no call in it."""
    try:
        ctx.check()
    except Cancelled:
        return True
    return False


def run_fused(member: Member, ctx: RunContext, tools: dict[str, Tool], tctx: ToolContext, calls) -> tuple[int, bool]:
    """Inside the model turn's fence: run its leading fusable calls and persist their results (tool.called,
    the result, tool.result; no phase of their own). Returns (how many ran, whether one waits for the operator)."""
    done = 0
    for call in calls:
        if not fusable(ctx, tools, call.name):  # on the permission mode this very fence has read
            break
        item = {"id": call.id, "name": call.name, "args": call.args}
        tool = tools.get(call.name)
        done += 1
        if tool is None:
            persist_result(member, tctx, item, f"error: unknown tool '{call.name}'; available: {', '.join(sorted(tools))}")
            continue
        args = call.args if isinstance(call.args, dict) else {}
        events.emit(member.space_id, "tool.called", member=member, tool=tool.name, args=_short(args))
        if tool.name in LOCAL_TOOLS:
            result = run_tool(tool, tctx, args, savepoint=False)
        else:
            tctx.log.flush()  # a verb may read the session's rows: they are all written first
            result = run_tool(tool, tctx, {**args, "_call_id": call.id} if tool.name == "ask_operator" else args)
            if isinstance(result, WaitForOperator):
                ctx.phase(Phase.WAITING_INPUT)
                return done, True
        persist_result(member, tctx, item, observe(member, tctx, tools, tool, args, result))
    if done == len(calls):
        ctx.phase(Phase.THINKING)  # the next model call's (a no-op: the step began in it)
    return done, False


def next_phase(ctx: RunContext, phase: str, tool: str = "") -> None:
    """The phase the run's next fence writes (a context without next_phase writes it when asked)."""
    later = getattr(ctx, "next_phase", None)
    if later is not None:
        later(phase, tool)


def permission_mode(ctx: RunContext, member: Member) -> str:
    """As read by the run's latest fence (every step has one); a context without it reads the row."""
    mode = getattr(ctx, "permission_mode", None)
    if mode is None:
        mode = Member.objects.filter(pk=member.pk).values_list("permission_mode", flat=True).first()
    return mode


def held_by_gate(ctx: RunContext, tool: Tool) -> bool:
    """The permission gate: in `default` mode a mutating call waits for an operator, unless a rule
    always allows this tool for this member (read per call: a revoke holds the very next one)."""
    if not tool.needs_approval or permission_mode(ctx, ctx.member) != PermissionMode.DEFAULT:
        return False
    return not approval_verbs.always_allowed(ctx.member, tool.name)


def announceable(ctx: RunContext, tools: dict[str, Tool], name: str) -> bool:
    tool = tools.get(name)
    return tool is not None and not held_by_gate(ctx, tool)


def announce(member: Member, ctx: RunContext, tools: dict[str, Tool], call) -> bool:
    """Inside the model turn's fence: the first call starts (phase + tool.called) unless the gate holds it,
    judged on the permission mode this very fence has read."""
    if not announceable(ctx, tools, call.name):
        return False
    args = call.args if isinstance(call.args, dict) else {}
    ctx.phase(Phase.EXECUTING, call.name)  # a no-op when the fence wrote it
    events.emit(member.space_id, "tool.called", member=member, tool=call.name, args=_short(args))
    return True


def call_model(ctx: RunContext, provider: Provider, system: str, messages: list[dict], specs: list[dict], *,
               chars: int | None = None) -> Reply:
    """One model call. A failed call is metered here; a reply is metered by the caller, in the fence
    that persists it (the breaker is checked after every call either way)."""
    member = ctx.member
    idle = getattr(ctx, "idle", None)  # a run of a worker's run pool gives its connection back while it waits
    if idle is not None:
        idle()
    sink = LiveSink(member, ctx)
    try:
        try:
            with sdk.call_scope(f"member:{member.pk}"):  # through the host's model gateway, a call outlives a dead worker
                reply = tracing.complete(provider, member.model, system, messages, specs, should_stop=ctx.should_stop,  # a chat span
                                          on_event=sink)
        finally:
            sink.close()  # before any fence below (a failed call's meter) could carry its unshown texting phase
    except ProviderCancelled as exc:
        if getattr(exc, "usage", None) is not None:  # cut off mid-stream: what the vendor generated before the hang-up is billed
            metering.record(ctx, getattr(exc, "model", "") or member.model, exc.usage)  # outside the fence when the lease is what was lost
        raise ctx.stop_reason() from None
    except ProviderError as exc:
        metering.record(ctx, getattr(exc, "model", "") or member.model, exc.usage)
        raise
    return storable_reply(metering.with_usage(reply, system, messages, specs, chars=chars))


CALL_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")  # what every vendor takes back, and what the columns hold


def storable_reply(reply: Reply) -> Reply:
    """The reply as it can be persisted: a NUL or an unpaired surrogate from the model becomes U+FFFD
    (veronica.plumbing.errors.storable) instead of failing the step's transaction on PostgreSQL. A tool name
    past the vendors' 64 characters (never a real tool: it gets "unknown tool") is cut there; a call id
    that is empty, over 80 characters, of other characters or repeated within the reply is replaced by
    a fresh one, so each call's result pairs with its call, and is stored, whatever the model sent."""
    calls, seen = [], set()
    for i, c in enumerate(reply.tool_calls):
        call_id = storable(c.id) if isinstance(c.id, str) else ""
        if not CALL_ID.fullmatch(call_id) or call_id in seen:
            call_id = f"call_{uuid.uuid4().hex[:24]}"  # unique, not derived: a server repeating ids repeats them
        seen.add(call_id)
        name = storable(c.name)[:MCP_NAME_LIMIT] if isinstance(c.name, str) else ""
        calls.append(ToolCall(id=call_id, name=name, args=storable(c.args)))
    return dataclasses.replace(reply, text=storable(reply.text), tool_calls=calls)


def stop_for_budget(member: Member, ctx: RunContext, tctx: ToolContext, reply: Reply) -> str:
    """Over budget right after a model call: its tool calls are answered, not run."""
    with ctx.fenced():
        for call in reply.tool_calls:
            persist_result(member, tctx, {"id": call.id, "name": call.name}, OVER_BUDGET)
        ctx.phase(Phase.PAUSED)
    return RunOutcome.BUDGET


def answer_turn(member: Member, log_: transcript.Log, reply: Reply) -> None:
    """Persist the model's turn; the mail its brief carried is read from this moment on (marked once a run)."""
    brief = log_.last_user
    calls = [{"id": c.id, "name": c.name, "args": c.args} for c in reply.tool_calls]
    prompt = reply.usage.input + reply.usage.cache_read + reply.usage.cache_write  # cached or not: the context pressure
    log_.append(TurnRole.ASSISTANT, reply.text, tool_calls=calls, tokens=reply.usage.total, input_tokens=prompt)
    if brief is not None and brief.mail_ids and brief.pk not in log_.marked:
        bus.mark_read(member, brief.mail_ids)
        log_.marked.add(brief.pk)
    if reply.text:
        events.emit(member.space_id, "agent.text", member=member, text=reply.text[:2000], truncated=reply.truncated)
    if reply.text and not reply.tool_calls and not reply.truncated:  # a final answer: the operator's mail gets it
        chat.record_reply(member, brief, reply.text, asked=getattr(log_, "operator_mail", None))


UNPARSED = "_unparsed"  # a provider's key for arguments that were not one JSON object (the raw text)


def unparsed_error(name: str, raw: object) -> str:
    preview = str(raw)[:200]
    return (f"error: the arguments of {name} were not one JSON object ({preview!r}); call {name} again with its "
            "arguments as a single JSON object")


@tracing.traced_tool  # an execute_tool span per call
def run_tool(tool: Tool, tctx: ToolContext, args: dict, *, savepoint: bool = True):
    """Tool errors come back as text the model can read; they never crash the run. A tool that
    writes rows runs in a savepoint, so a failing one leaves nothing half-written; ask_operator's
    WaitForOperator is returned (not raised) so its question survives the savepoint."""
    if UNPARSED in args:  # never run as if it had been called with no arguments
        return unparsed_error(tool.name, args[UNPARSED])
    try:
        if not savepoint:
            try:
                return truncate(mask(tool.fn(tctx, args), tctx.space.pk))  # masked whole, before a cut could split a secret
            except WaitForOperator as wait:  # an a2a__ call parked on its remote task
                return wait
        with transaction.atomic():
            try:
                return truncate(mask(tool.fn(tctx, args), tctx.space.pk))
            except WaitForOperator as wait:
                return wait
    except (ToolError, VeronicaError) as exc:
        return mask(f"error: {exc}", tctx.space.pk)
    except Exception as exc:  # an unexpected tool bug is still just a tool result
        log.exception("tool %s crashed", tool.name)
        return mask(f"error: {tool.name} failed unexpectedly ({type(exc).__name__}: {exc})", tctx.space.pk)


def execute(member: Member, ctx: RunContext, tools: dict[str, Tool], tctx: ToolContext, call: dict, *,
            announced: bool = False, then: str | None = None) -> str | None:
    """One tool call. announced: its start (phase, tool.called) was written with the model's turn.
    then: the phase the result's fence writes (the next model call's), so it costs no commit of its own."""
    tool = tools.get(call["name"])
    args = call["args"] if isinstance(call["args"], dict) else {}
    if tool is None:
        with ctx.fenced():
            return persist_result(member, tctx, call, f"error: unknown tool '{call['name']}'; available: {', '.join(sorted(tools))}")
    if UNPARSED in args:  # nothing to approve or run: the model is told at once
        with ctx.fenced():
            return persist_result(member, tctx, call, unparsed_error(tool.name, args[UNPARSED]))
    if not announced:
        if held_by_gate(ctx, tool):  # read per call
            return hold_for_approval(member, ctx, call)
        with ctx.fenced():
            ctx.phase(Phase.EXECUTING, tool.name)
            events.emit(member.space_id, "tool.called", member=member, tool=tool.name, args=_short(args))
    return run_and_persist(member, ctx, tools, tctx, tool, call, args, then=then)


def run_and_persist(member: Member, ctx: RunContext, tools: dict[str, Tool], tctx: ToolContext, tool: Tool, call: dict,
                    args: dict, *, consume=None, then: str | None = None) -> str | None:
    """Run one call and persist its result under the lease (with `consume`, the held decision it used).
    A call whose effects live outside the database (files, commands, MCP servers) runs outside the
    run's transaction, so its I/O never holds the fence's row locks; its result is fenced after."""
    if escapes_the_fence(tool):
        if isinstance(tool, A2ATool):  # its call id names the parked call, if the remote task outlives the inline wait
            args = {**args, "_call_id": call["id"]}
        if tool.name in INLINE_TOOLS:
            result = run_tool(tool, tctx, args, savepoint=False)
        else:
            result = ctx.keep_alive(lambda: run_tool(tool, tctx, args, savepoint=False))
        if isinstance(result, WaitForOperator):  # parked: no worker waits; the tick wakes the member when it ends
            with ctx.fenced():
                if consume:
                    consume()
                ctx.phase(Phase.WAITING_INPUT, call["name"])
            return WAITING
        if then:
            next_phase(ctx, then)
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
        persist_result(member, tctx, call, observe(member, tctx, tools, tool, args, result))
        if then:
            ctx.phase(then)  # in this commit: the next model call's phase
        return None


def observe(member: Member, tctx: ToolContext, tools: dict[str, Tool], tool: Tool, args: dict, result: str) -> str:
    if not tool.mutates and not result.startswith("error:"):
        return result + waggle_bridge.after_call(member, tctx, tools, tool.name, args, result)
    if tool.mutates:
        waggle_bridge.observe(member, tctx, tool.name, args, result, mutates=True)
    return result


def persist_result(member: Member, tctx: ToolContext, call: dict, result: str) -> None:
    """Callers hold the run's fence."""
    result = storable(result)  # e.g. an MCP tool's output with a NUL in it
    fields = dict(tool_call_id=call["id"], tool_name=call["name"])
    if tctx.log is not None:
        tctx.log.append(TurnRole.TOOL, result, **fields)
    else:
        transcript.append(tctx.session, TurnRole.TOOL, result, **fields)
    events.emit(member.space_id, "tool.result", member=member, tool=call["name"], ok=not result.startswith("error:"),
                chars=len(result), preview=result[:200], call=call["id"])  # call: the run trace finds the whole result
    return None


def hold_for_approval(member: Member, ctx: RunContext, call: dict) -> str:
    with ctx.fenced():
        approval, created = Approval.objects.get_or_create(  # a consumed one is an earlier call that reused the id
            member=member, tool_call_id=call["id"], consumed=False,
            defaults={"space_id": member.space_id, "tool_name": call["name"], "tool_args": call["args"]})
        if created:
            events.emit(member.space_id, "approval.requested", member=member, approval=approval.pk, tool=call["name"],
                        args=_short(call["args"]), run=ctx.run.pk)  # the run trace links a chain's runs by these
        ctx.phase(Phase.WAITING_APPROVAL, call["name"])
    return WAITING


def resolve_held(member: Member, ctx: RunContext, tools: dict[str, Tool], tctx: ToolContext, call: dict) -> str | None:
    """A call left without a result: decided approval, answered question, or an interrupted call."""
    # Never a consumed one: its call has its result, so this is a later call under the same id (a server
    # that numbers calls per reply): the old decision must not run it.
    approval = Approval.objects.filter(member=member, tool_call_id=call["id"], consumed=False).first()
    if approval is not None:
        if approval.status == ApprovalStatus.PENDING:
            ctx.phase(Phase.WAITING_APPROVAL, call["name"])
            return WAITING

        tracing.event("approval.resolved", approval=approval.pk, tool=call["name"], status=approval.status)

        def consume() -> None:  # inside the fence that persists the call's result
            Approval.objects.filter(pk=approval.pk).update(consumed=True)
            events.emit(member.space_id, "approval.resolved", member=member, approval=approval.pk, tool=call["name"],
                        status=approval.status, run=ctx.run.pk)
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
    question = Question.objects.filter(member=member, tool_call_id=call["id"], consumed=False).first()
    if question is not None:
        if question.answered_at is None:
            ctx.phase(Phase.WAITING_INPUT)
            return WAITING
        with ctx.fenced():
            Question.objects.filter(pk=question.pk).update(consumed=True)
            return persist_result(member, tctx, call, f"The operator answered: {question.answer}")
    parked = a2a_tools.held(member, call["id"])  # an a2a__ call waiting on its remote task
    if parked is not None:
        if parked.finished_at is None:
            ctx.phase(Phase.WAITING_INPUT, call["name"])
            return WAITING
        with ctx.fenced():
            return persist_result(member, tctx, call, a2a_tools.consume(parked))
    tool = tools.get(call["name"])
    if tool is not None and rerun_is_safe(tool):  # it never took effect (rolled back) or it only reads
        return execute(member, ctx, tools, tctx, call)
    with ctx.fenced():
        return persist_result(member, tctx, call, INTERRUPTED)


def escapes_the_fence(tool: Tool) -> bool:
    """Its effects live outside the run's transaction (files, commands, an MCP server): a crash
    during it cannot roll them back."""
    return tool.name in LOCAL_TOOLS or isinstance(tool, (McpTool, A2ATool))


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
