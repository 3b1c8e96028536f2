"""Every model call is metered (DESIGN §3): replies, failed calls and compaction alike. A reply that
came without usage is estimated (characters / 4) and counted as an estimate, never as zero. A call
that completed after its run lost its lease is metered too (the vendor billed it), outside the fence."""
from __future__ import annotations

import json
import logging
from contextlib import contextmanager

from django.db import transaction
from django.db.models import Case, F, Q, When

from veronica.agent.providers.base import Reply, Usage
from veronica.agent.providers.pricing import usd_for
from veronica.agent.runctx import LeaseLost, RunContext
from veronica.swarm import meter

log = logging.getLogger(__name__)
CHARS_PER_TOKEN = 4


def estimate_tokens(system: str, messages: list[dict], tools: list[dict]) -> int:
    """The size of a request, for the compaction threshold and for usage the vendor did not report."""
    chars = len(system) + len(json.dumps(tools)) + sum(
        len(m.get("content") or "") + len(json.dumps(m.get("tool_calls") or [])) for m in messages)
    return chars // CHARS_PER_TOKEN


def with_usage(reply: Reply, system: str, messages: list[dict], tools: list[dict], *, chars: int | None = None) -> Reply:
    """chars: the request's size as estimate_tokens counts it, when the caller keeps it (the run's Log
    does, so an unreported usage costs O(1) in the transcript's length, not a pass over it)."""
    if reply.usage.total or reply.usage.estimated:
        return reply
    out = len(reply.text) + len(json.dumps([c.args for c in reply.tool_calls]))
    estimate = chars // CHARS_PER_TOKEN if chars is not None else estimate_tokens(system, messages, tools)
    reply.usage = Usage(input=max(estimate, 1), output=max(out // CHARS_PER_TOKEN, 1), estimated=True)
    return reply


def record(ctx: RunContext, model: str, usage: Usage | None, *, purpose: str = "") -> bool:
    """Meter one call under the run's lease, then check the breaker. True when it is tripped.
    The `model.called` event is the end of the call's span on the run trace page (veronica.web.run_trace).

    A run that lost its lease while the call was in flight still spent the money: the call is
    metered all the same (record_stale) and LeaseLost goes on, so the run writes nothing else."""
    from veronica.swarm import events
    from veronica.models import Run

    usage = usage or Usage()
    member = ctx.member
    usd = usd_for(model, usage)
    _carry(ctx, member, usage, usd)  # when this opens the fence; inside billed(), billed's fence carried it
    try:
        with ctx.fenced():
            take = getattr(ctx, "take_metered", None)
            row = take() if take is not None else None
            if row is not None:  # the fence statement metered this call
                used, tripped = meter.metered(row)
            else:
                used, tripped = meter.meter_returning(member, input_tokens=usage.input, output_tokens=usage.output,
                                                       cache_read=usage.cache_read, cache_write=usage.cache_write,
                                                       usd=usd, estimated_calls=int(usage.estimated))
            count_call = getattr(ctx, "count_call", None)
            if count_call is not None:  # the run's counters, written with its end (usage above is the meter)
                count_call(usage.total)
            else:
                Run.objects.filter(pk=ctx.run.pk).update(model_calls=F("model_calls") + 1, tokens=F("tokens") + usage.total)
            events.emit(member.space_id, "model.called", member=member, run=ctx.run.pk, model=model, input=usage.input,
                        output=usage.output, cached=usage.cache_read, cache_write=usage.cache_write, usd=str(usd),
                        estimated=usage.estimated,
                        **({"purpose": purpose} if purpose else {}))
            return tripped or bool(meter.check_breaker(member, used))
    except LeaseLost as lost:  # raised by the fence before it wrote anything: meter once, outside it
        if not getattr(lost, "metered", False):
            record_stale(ctx, usage, usd)
            lost.metered = True
        raise


def _carry(ctx: RunContext, member, usage: Usage, usd) -> bool:
    """Hand the usage statement to the fence about to open, when the context can carry it (PostgreSQL):
    one statement for the lease, the phase, the cancel flag and the meter. A fence that is refused
    (lease gone) runs neither, and the call is metered outside it (record_stale), as before."""
    carry = getattr(ctx, "meter_in_fence", None)
    if carry is None:
        return False
    # made only when the fence will carry it (not inside billed()'s fence, already open)
    return carry(lambda: meter.meter_statement(member, input_tokens=usage.input, output_tokens=usage.output,
                                                cache_read=usage.cache_read, cache_write=usage.cache_write, usd=usd,
                                                estimated_calls=int(usage.estimated)))


@contextmanager
def billed(ctx: RunContext, model: str, usage: Usage | None):
    """A fence whose transaction meters a completed call (record inside it) with the turn it persists.
    If the fence refuses or rolls back because the lease is gone, the call was billed all the same:
    it is metered outside the fence (record_stale), once, and LeaseLost goes on."""
    usage = usage or Usage()
    _carry(ctx, ctx.member, usage, usd_for(model, usage))  # record() inside takes the fence's row
    try:
        with ctx.fenced():
            yield
    except LeaseLost as lost:
        if not getattr(lost, "metered", False):
            record_stale(ctx, usage, usd_for(model, usage))
            lost.metered = True
        raise


def record_stale(ctx: RunContext, usage: Usage, usd) -> None:
    """Usage is a ledger of money spent, not state of the run: the member's day counters and the stale
    run's own cost counters take commutative F() increments that cannot clobber the new run's writes.
    Nothing else (turns, mail, phase, events, the Run row's outcome) is touched, and the breaker is
    left to the next fenced call, which counts this one. The run's counters kept in memory for its
    finish (which will not come) go to its Run row with this call."""
    from veronica.models import Run

    calls, tokens = 1 + getattr(ctx, "model_calls", 0), usage.total + getattr(ctx, "tokens", 0)
    if hasattr(ctx, "model_calls"):
        ctx.model_calls = ctx.tokens = 0
    with transaction.atomic():
        meter.meter(ctx.member, input_tokens=usage.input, output_tokens=usage.output, cache_read=usage.cache_read,
                     cache_write=usage.cache_write, usd=usd, estimated_calls=int(usage.estimated))
        # If the watchdog already recounted the run from its events (leases._recount), the kept
        # counters are in the row: add this call alone, or they would count twice.
        recounted = Q(model_calls__gt=0)
        Run.objects.filter(pk=ctx.run.pk).update(
            model_calls=Case(When(recounted, then=F("model_calls") + 1), default=F("model_calls") + calls),
            tokens=Case(When(recounted, then=F("tokens") + usage.total), default=F("tokens") + tokens))
    log.warning("run %s of %s lost its lease during a model call; its %d tokens are metered to it all the same",
                ctx.run.pk, ctx.member.name, usage.total)
