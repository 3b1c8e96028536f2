"""The run trace view and the usage page, built from the rows the engine writes (Event, Run, UsageDay).

A run's trace is its member's events from `run.started` to `run.ended` (both carry the run id; the
seq range is exact, commit order). A run the watchdog ended (lease expired: its worker died or
stalled) has no `run.ended`: its events stop at the member's next `run.started`, and nothing it tried
to write after the lease was gone exists (every write is fenced), so its open spans show as cut off.

Spans: a model call runs from the `thinking` phase (or the previous call's end, or a tool's result)
to its `model.called` event (written by the metering, with tokens and USD; `purpose` "compaction"
for a summarizing call). Retries (`agent.retry`) and streamed text (`agent.delta`) count on the call
they happened in; `agent.text` is the persisted reply. A tool call is `tool.called` .. `tool.result`;
an MCP tool (`mcp__<server>__<tool>`) names its server. Waggle replays mark the tool call they
followed; approvals are markers.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation

from django.http import Http404
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from veronica.engine import budget
from veronica.models import Approval, ApprovalStatus, Event, Member, Run, RunOutcome, Space, Turn, TurnRole, UsageDay

USAGE_DAYS = 30
MCP_PREFIX = "mcp__"
LEASE_LOST = ("The watchdog ended this run: its lease expired (the worker died or stalled). Whatever it tried "
              "to write after that was refused by the fence; the member was woken to resume.")


@dataclass
class Span:
    kind: str  # model | tool | approval | replay
    name: str
    start: datetime
    end: datetime | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cached: int = 0
    usd: Decimal = Decimal(0)
    retries: int = 0
    errors: list[str] = field(default_factory=list)
    marks: list[str] = field(default_factory=list)
    text: str = ""
    detail: str = ""
    server: str = ""  # the MCP server of an mcp__ tool
    approval: int | None = None  # the Approval a held call asked for
    chars: int = 0  # a tool result's whole length (text is the whole result once _whole_results found it)
    call: str = ""  # a tool result's call id (events since issue 22)


def run_in_space(space: Space, run_id: int) -> Run:
    """A run of this space, or 404: another space's run does not exist here."""
    run = Run.objects.select_related("member").filter(pk=run_id, member__space=space).first()
    if run is None:
        raise Http404("no such run")
    return run


def _run_events(run: Run) -> list[Event]:
    space_id = run.member.space_id
    mine = Event.objects.filter(space_id=space_id, member_id=run.member_id)
    started = mine.filter(kind="run.started", payload__run=run.pk).values_list("seq", flat=True).first()
    if started is None:  # the start event was purged (retention): fall back to the run's own clock
        qs = mine.filter(created_at__gte=run.started_at)
        return list((qs.filter(created_at__lte=run.ended_at) if run.ended_at else qs).order_by("seq"))
    ended = mine.filter(kind="run.ended", payload__run=run.pk).values_list("seq", flat=True).first()
    if ended is None:  # still running, or ended by the watchdog: up to the member's next run
        ended = mine.filter(kind="run.started", seq__gt=started).order_by("seq").values_list("seq", flat=True).first()
        ended = ended - 1 if ended is not None else None
    qs = mine.filter(seq__gte=started)
    return list((qs.filter(seq__lte=ended) if ended is not None else qs).order_by("seq"))


def _usd(raw: object) -> Decimal:
    try:
        return Decimal(str(raw))
    except (InvalidOperation, ValueError):
        return Decimal(0)


def _tool_span(name: str, at: datetime, args: object) -> Span:
    span = Span("tool", name, at, detail=_args_text(args))
    if name.startswith(MCP_PREFIX):
        span.server = name[len(MCP_PREFIX):].partition("__")[0]
    return span


def spans_of(events: list[Event]) -> tuple[list[Span], str]:
    """The spans of a run and the run's error text (from run.ended, or the watchdog's note)."""
    spans: list[Span] = []
    tools: list[Span] = []  # open tool calls, oldest first
    held_marks: dict[str, list[str]] = {}  # an a2a__ call's remote-task marks, seen before its span
    cursor: datetime | None = None  # where the next model call starts
    pending = {"open": False, "retries": 0, "errors": [], "streamed": ""}  # the model call in flight
    last_model: Span | None = None  # the latest finished call, for its agent.text
    error = ""

    def reset() -> None:
        pending.update(open=False, retries=0, errors=[], streamed="")

    for ev in events:
        p = ev.payload if isinstance(ev.payload, dict) else {}
        kind, at = ev.kind, ev.created_at
        if kind == "run.started":
            cursor = at
        elif kind == "member.phase" and p.get("phase") == "thinking":
            if not pending["open"]:
                cursor, pending["open"] = at, True
        elif kind == "agent.retry":
            pending["open"] = True
            pending["retries"] += 1
            pending["errors"].append(str(p.get("text") or p.get("reason") or "retry"))
            pending["streamed"] = ""
        elif kind == "model.fallback":  # the model was overloaded or down: the next one of the chain answers
            pending["open"] = True
            pending["errors"].append(str(p.get("text") or f"switched to {p.get('to')}"))
            pending["streamed"] = ""
        elif kind == "agent.delta":
            pending["open"] = True
            text = str(p.get("text") or "")
            pending["streamed"] = pending["streamed"] + text if p.get("offset") else text
        elif kind == "model.called":
            compaction = p.get("purpose") == "compaction"
            span = Span("model", ("compaction: " if compaction else "") + str(p.get("model") or "model call"), cursor or at, end=at,
                        tokens_in=int(p.get("input") or 0), tokens_out=int(p.get("output") or 0), cached=int(p.get("cached") or 0),
                        usd=_usd(p.get("usd")), retries=pending["retries"], errors=list(pending["errors"]), text=pending["streamed"])
            if p.get("estimated"):
                span.marks.append("usage estimated (the vendor reported none)")
            spans.append(span)
            last_model = None if compaction else span
            cursor = at
            reset()
        elif kind == "agent.text":
            if last_model is not None:
                last_model.text = str(p.get("text") or "")
                if p.get("truncated"):
                    last_model.marks.append("cut off at the output token limit; continued")
        elif kind == "tool.called":
            span = _tool_span(str(p.get("tool") or "?"), at, p.get("args"))
            spans.append(span)
            tools.append(span)
            last_model = None
        elif kind == "tool.result":
            span = next((s for s in tools if s.name == p.get("tool")), None)
            if span is None:  # a result without its call: a held call resolved, or an unknown tool
                span = _tool_span(str(p.get("tool") or "?"), cursor or at, None)
                spans.append(span)
            else:
                tools.remove(span)
            span.end = at
            span.marks += held_marks.pop(span.name, [])
            span.text = str(p.get("preview") or "")
            span.chars = p.get("chars") if isinstance(p.get("chars"), int) else len(span.text)
            span.call = str(p.get("call") or "")
            if p.get("ok") is False:
                span.errors.append(span.text or "error")
            cursor = at
        elif kind in ("a2a.called", "a2a.parked"):  # the remote agent's task, marked on its a2a__ call
            span = next((sp for sp in reversed(spans) if sp.kind == "tool" and sp.name == f"a2a__{p.get('remote')}"), None)
            mark = (f"parked on remote task {p.get('task')}: the run ends, the task's end wakes the member"
                    if kind == "a2a.parked" else f"remote task {p.get('task') or '?'} {p.get('state') or 'failed'}"
                    + (f" in {p.get('seconds')} s" if p.get("seconds") is not None else ""))
            if span is not None and span.end is None:
                span.marks.append(mark)
            else:  # a held call resumed: its span opens with its result, which comes after
                held_marks.setdefault(f"a2a__{p.get('remote')}", []).append(mark)
        elif kind == "waggle.replayed":
            after = next((s for s in reversed(spans) if s.kind == "tool" and s.name == p.get("after")), None)
            mark = f"waggle replayed after {p.get('after')} ({p.get('chars', 0)} chars)"
            if after is not None:
                after.marks.append(mark)
            spans.append(Span("replay", f"waggle after {p.get('after') or '?'}", at, end=at, marks=[mark]))
        elif kind == "approval.requested":
            spans.append(Span("approval", f"approval: {p.get('tool') or '?'}", at, end=at, detail=_args_text(p.get("args")),
                              marks=[f"approval #{p.get('approval')} requested"],
                              approval=p.get("approval") if isinstance(p.get("approval"), int) else None))
        elif kind == "approval.decided":
            spans.append(Span("approval", f"approval {p.get('status') or 'decided'}: {p.get('tool') or '?'}", at, end=at,
                              marks=[f"by {p.get('by') or '?'}"]))
        elif kind == "run.lease_expired":
            error = LEASE_LOST
        elif kind == "run.ended":
            error = str(p.get("error") or "")
    if error and not pending["open"] and spans and spans[-1].kind == "model" and not spans[-1].text:
        spans[-1].errors.append(error)  # the call the run failed on (metered, then raised)
    if pending["open"]:  # a call that never returned: still running, failed, or cut off with the lease
        spans.append(Span("model", "model call", cursor or events[-1].created_at, retries=pending["retries"],
                          errors=list(pending["errors"]) + ([error] if error else []), text=pending["streamed"]))
    return spans, error


def _args_text(args: object) -> str:
    if isinstance(args, dict):
        return ", ".join(f"{k}={v}" for k, v in args.items())[:300]
    return str(args or "")[:300]


def _mark_decisions(spans: list[Span], run: Run) -> None:
    """A held call is decided after its run ended (the run waits): the decision is read from its
    Approval row and marked on the request."""
    asked = {s.approval: s for s in spans if s.approval is not None}
    for approval in Approval.objects.filter(pk__in=list(asked), member_id=run.member_id).select_related("decided_by"):
        span = asked[approval.pk]
        if approval.status == ApprovalStatus.PENDING:
            span.marks.append("waiting for a decision")
            continue
        by = approval.decided_by.get_username() if approval.decided_by_id else "?"
        when = f" at {approval.decided_at:%Y-%m-%d %H:%M:%S} UTC" if approval.decided_at else ""
        span.marks.append(f"{approval.status} by {by}{when}" + (f": {approval.reason}" if approval.reason else ""))


def _whole_results(spans: list[Span], run: Run) -> None:
    """The events carry a 200-character preview; the transcript holds each result whole. A result span
    takes the next unclaimed tool turn of the run with its call id (or, for older events, its tool name)."""
    results = [s for s in spans if s.kind == "tool" and s.end is not None]
    if not results:
        return
    turns = Turn.objects.filter(session__member_id=run.member_id, role=TurnRole.TOOL, created_at__gte=run.started_at)
    if run.ended_at is not None:
        turns = turns.filter(created_at__lte=run.ended_at)
    pool = list(turns.order_by("created_at", "seq").values("tool_call_id", "tool_name", "content")[:500])
    for span in results:
        found = next((t for t in pool if (t["tool_call_id"] == span.call if span.call else t["tool_name"] == span.name)), None)
        if found is not None:
            pool.remove(found)
            span.text, span.chars = found["content"], len(found["content"])


def approval_chain(run: Run, events: list[Event], limit: int = 50) -> list[dict]:
    """The runs of this run's approval chain, in order: a run that held a call for approval, the run
    that resolved the decision (and may have held the next one), and so on. [] when there is no chain.
    This run's own links come from its events (no query when it has none)."""
    def named(kind: str) -> int | None:
        ids = [e.payload.get("approval") for e in events if e.kind == kind and isinstance(e.payload, dict)]
        return ids[-1] if ids else None

    chain = [run.pk]
    approval = named("approval.resolved")  # back: the run that asked for what this run resolved
    while approval is not None and len(chain) < limit:
        prev = _run_of(run.member_id, "approval.requested", approval)
        if prev is None or prev in chain:
            break
        chain.insert(0, prev)
        approval = _approval_of(run.member_id, "approval.resolved", prev)
    approval = named("approval.requested")  # on: the run that resolved what this run asked for
    while approval is not None and len(chain) < limit:
        nxt = _run_of(run.member_id, "approval.resolved", approval)
        if nxt is None or nxt in chain:
            break
        chain.append(nxt)
        approval = _approval_of(run.member_id, "approval.requested", nxt)
    if len(chain) == 1:
        return []
    outcomes = dict(Run.objects.filter(pk__in=chain).values_list("id", "outcome"))
    return [{"run": r, "outcome": outcomes.get(r, "?"), "current": r == run.pk} for r in chain]


def _run_of(member_id: int, kind: str, approval: int) -> int | None:
    return (Event.objects.filter(member_id=member_id, kind=kind, payload__approval=approval).order_by("-seq")
            .values_list("payload__run", flat=True).first())


def _approval_of(member_id: int, kind: str, run_id: int) -> int | None:
    return (Event.objects.filter(member_id=member_id, kind=kind, payload__run=run_id).order_by("-seq")
            .values_list("payload__approval", flat=True).first())


def trace(run: Run) -> dict:
    """The page's data: the run, its spans with waterfall geometry (percent of the run), totals."""
    events = _run_events(run)
    spans, error = spans_of(events)
    _mark_decisions(spans, run)
    _whole_results(spans, run)
    lease_lost = run.outcome == RunOutcome.LEASE_EXPIRED
    if lease_lost:
        error = LEASE_LOST
    start = run.started_at
    end = run.ended_at or max([s.end or s.start for s in spans] + [timezone.now()])
    total = max((end - start).total_seconds(), 0.001)
    rows = []
    for s in spans:
        s_end = s.end or end
        offset = max((s.start - start).total_seconds(), 0.0)
        duration = max((s_end - s.start).total_seconds(), 0.0)
        rows.append({
            "kind": s.kind, "name": s.name, "offset_ms": round(offset * 1000), "duration_ms": round(duration * 1000),
            "unfinished": s.end is None and s.kind in ("model", "tool"), "server": s.server, "tokens_in": s.tokens_in, "tokens_out": s.tokens_out,
            "cached": s.cached, "usd": s.usd, "retries": s.retries, "errors": s.errors, "marks": s.marks, "text": s.text,
            "chars": s.chars if s.kind == "tool" else len(s.text),
            "detail": s.detail, "x": round(min(offset / total, 1) * 100, 2),
            "w": round(max(min(duration / total, 1 - min(offset / total, 1)) * 100, 0.6), 2),
        })
    models = [r for r in rows if r["kind"] == "model"]
    return {
        "run": run, "member": run.member.name, "rows": rows, "error": error or run.error, "chain": approval_chain(run, events),
        "duration_ms": round(total * 1000), "running": run.ended_at is None, "lease_lost": lease_lost,
        "totals": {"model_calls": len(models), "tool_calls": sum(r["kind"] == "tool" for r in rows),
                   "mcp_calls": sum(bool(r["server"]) for r in rows),
                   "tokens_in": sum(r["tokens_in"] for r in models), "tokens_out": sum(r["tokens_out"] for r in models),
                   "usd": sum((r["usd"] for r in models), Decimal(0)), "retries": sum(r["retries"] for r in models),
                   "errors": sum(len(r["errors"]) for r in rows)},
    }


def recent_runs(member: Member, limit: int = 10) -> list[Run]:
    return list(Run.objects.filter(member=member).order_by("-id")[:limit])


def run_for_turns(member: Member, turns: list[dict]) -> None:
    """Tag each transcript turn with the run it was written in (by time: a run holds the member's slot)."""
    times = [parse_datetime(t["created_at"]) if t.get("created_at") else None for t in turns]
    known = [t for t in times if t is not None]
    if not known:
        return
    runs = list(Run.objects.filter(member=member, started_at__lte=max(known)).order_by("-started_at")
                .values("id", "started_at", "ended_at")[:200])
    for turn, at in zip(turns, times):
        turn["run"] = None if at is None else next((r["id"] for r in runs if r["started_at"] <= at and (r["ended_at"] is None or at <= r["ended_at"])),
                           None)


# --- usage page -----------------------------------------------------------------------------------------

def usage(space: Space, days: int = USAGE_DAYS) -> dict:
    """Tokens and USD per member per day over the last `days` UTC days, each member against its
    daily budget and the space against its ceilings; waggle's estimated savings per day beside them."""
    today = budget.today()
    first = today - timedelta(days=days - 1)
    day_list = [first + timedelta(days=i) for i in range(days)]
    rows = UsageDay.objects.filter(space=space, day__gte=first).select_related("member")
    by_member: dict[int, dict] = {}
    space_days: dict = defaultdict(lambda: {"tokens": 0, "usd": Decimal(0)})
    for row in rows:
        entry = by_member.setdefault(row.member_id, {"member": row.member, "days": {}})
        entry["days"][row.day] = row
        space_days[row.day]["tokens"] += row.total_tokens
        space_days[row.day]["usd"] += row.usd
    for member in Member.objects.filter(space=space, removed_at__isnull=True):
        by_member.setdefault(member.pk, {"member": member, "days": {}})
    saved = _saved(space, days)
    members = []
    for entry in sorted(by_member.values(), key=lambda e: e["member"].name):
        member = entry["member"]
        member.space = space
        cap = budget.effective_budget(member)
        series = []
        for d in day_list:
            row = entry["days"].get(d)
            series.append({"day": d, "tokens": row.total_tokens if row else 0, "input": row.input_tokens if row else 0,
                           "output": row.output_tokens if row else 0, "cached": row.cache_read_tokens if row else 0,
                           "usd": row.usd if row else Decimal(0), "tripped": bool(row and row.tripped)})
        peak = max([cap] + [s["tokens"] for s in series] + [1])
        for i, s in enumerate(series):
            s["h"] = round(40 * s["tokens"] / peak, 2)
            s["y"] = round(40 - s["h"], 2)
            s["x"] = i * 10 + 1
            s["over"] = bool(cap and s["tokens"] >= cap)
        members.append({"name": member.name, "removed": member.removed_at is not None, "budget": cap,
                        "budget_y": round(40 - 40 * cap / peak, 2) if cap else None, "series": series,
                        "tokens": sum(s["tokens"] for s in series), "usd": sum((s["usd"] for s in series), Decimal(0))})
    totals = [{"day": d, "tokens": space_days[d]["tokens"], "usd": space_days[d]["usd"], "saved": saved.get(d, 0)}
              for d in day_list]
    return {"days": days, "first": first, "today": today, "members": members, "totals": totals, "width": days * 10,
            "ceiling_tokens": space.daily_token_ceiling, "ceiling_usd": space.daily_usd_ceiling,
            "member_default": space.member_daily_tokens, "saved_total": sum(saved.values()) if saved else 0,
            "waggle": saved is not None,
            "tokens": sum(t["tokens"] for t in totals), "usd": sum((t["usd"] for t in totals), Decimal(0))}


def _saved(space: Space, days: int) -> dict | None:
    try:
        from waggle.service import saved_tokens_per_day

        return dict(saved_tokens_per_day(str(space.pk), days=days))
    except Exception:  # waggle is optional: its absence only hides the column
        return None
