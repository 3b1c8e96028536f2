"""Every model call is metered (DESIGN §3): replies, failed calls and compaction alike. A reply that
came without usage is estimated (characters / 4) and counted as an estimate, never as zero."""
from __future__ import annotations

import json

from django.db.models import F

from veronica.agent.providers.base import Reply, Usage
from veronica.agent.providers.pricing import usd_for
from veronica.agent.runctx import RunContext
from veronica.engine import budget

CHARS_PER_TOKEN = 4


def estimate_tokens(system: str, messages: list[dict], tools: list[dict]) -> int:
    """The size of a request, for the compaction threshold and for usage the vendor did not report."""
    chars = len(system) + len(json.dumps(tools)) + sum(
        len(m.get("content") or "") + len(json.dumps(m.get("tool_calls") or [])) for m in messages)
    return chars // CHARS_PER_TOKEN


def with_usage(reply: Reply, system: str, messages: list[dict], tools: list[dict]) -> Reply:
    if reply.usage.total or reply.usage.estimated:
        return reply
    out = len(reply.text) + len(json.dumps([c.args for c in reply.tool_calls]))
    reply.usage = Usage(input=max(estimate_tokens(system, messages, tools), 1), output=max(out // CHARS_PER_TOKEN, 1),
                        estimated=True)
    return reply


def record(ctx: RunContext, model: str, usage: Usage | None) -> bool:
    """Meter one call under the run's lease, then check the breaker. True when it is tripped."""
    from veronica.models import Run

    usage = usage or Usage()
    member = ctx.member
    with ctx.fenced():
        used, tripped = budget.meter_returning(member, input_tokens=usage.input, output_tokens=usage.output,
                                               cache_read=usage.cache_read, cache_write=usage.cache_write,
                                               usd=usd_for(model, usage), estimated_calls=int(usage.estimated))
        count_call = getattr(ctx, "count_call", None)
        if count_call is not None:  # the run's counters, written with its end (usage above is the meter)
            count_call(usage.total)
        else:
            Run.objects.filter(pk=ctx.run.pk).update(model_calls=F("model_calls") + 1, tokens=F("tokens") + usage.total)
        return tripped or bool(budget.check_breaker(member, used))
