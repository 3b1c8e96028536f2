"""Prompt caching on a 20-turn Anthropic scenario, against the mock Anthropic server.

    .venv/bin/python bench/prompt_cache.py [--turns 20] [--model anthropic:claude-sonnet-4-5] [--min-cache 1024]

A worker with the real tool set (every schema the loop sends) and a ~1 kB system prompt works a
task: each turn the model calls read_file / grep and gets a ~600-character result back, as in a
real run. The mock simulates the API's caching (breakpoint prefixes written from `--min-cache`
tokens up, later requests read the longest cached prefix). It prints, per breakpoint layout, the
cached-token share (cache reads / all input tokens), cache writes, and the cost from the price table:

* none: no cache_control (what the hand-written client sent);
* stable prefix: the last tool and the system block (tools + system prompt);
* + conversation: also the last block of the conversation (what AnthropicProvider sends).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from decimal import Decimal
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def setup() -> None:
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "veronica.settings")
    os.environ.setdefault("VERONICA_DATA_DIR", str(REPO / "data" / "bench-prompt-cache"))
    import django

    django.setup()


def scenario(turns: int) -> list[dict]:
    """The scripted replies: tool calls over a codebase, then a final answer."""
    from tests.vendors import faults as f

    steps = []
    for i in range(turns - 1):
        steps.append(f.tool_call("read_file", {"path": f"src/module_{i}.py"}) if i % 3 else
                     f.tool_call("grep", {"pattern": "TODO", "path": f"src/pkg_{i}"}))
    steps.append(f.text("Done: the TODOs are listed in the task result."))
    return steps


def tool_result(i: int) -> str:
    return "\n".join(f"{n:4d}  def handler_{i}_{n}(request):  # TODO: validate input {n}" for n in range(10))


def run(layout: str, turns: int, model: str, min_cache: int) -> dict:
    from tests.vendors.mock_anthropic import MockAnthropic
    from veronica.agent.providers import pricing
    from veronica.agent.providers.anthropic import AnthropicProvider
    from veronica.agent.providers.base import Usage
    from veronica.agent.providers.sdk import CallConfig
    from veronica.agent.tools import tools_for

    specs = [t.spec() for t in tools_for("worker").values()]
    system = ("You are w1, a worker in team Alpha. Teammates reach you by mail; use the tools to act. "
              "Your workspace tools only see the space's folder.\n# Skills\n") + "\n".join(
        f"## skill-{i}\nRead the task, orient in the workspace, report findings with file and line." for i in range(12))

    class Layout(AnthropicProvider):
        def request_body(self, system_text, messages, tools):
            body = super().request_body(system_text, messages, tools)
            if layout == "+ conversation":
                return body
            body = copy.deepcopy(body)
            body["messages"][-1]["content"][-1].pop("cache_control", None)
            if layout == "none":
                body["system"] = system_text
                body["tools"][-1].pop("cache_control", None)
            return body

    with MockAnthropic(api_key="bench", min_cache_tokens=min_cache) as mock:
        mock.push(*scenario(turns))
        provider = Layout(model.partition(":")[2], mock.base_url, "bench", CallConfig(timeout=30, max_retries=0))
        messages = [{"role": "user", "content": "## Inbox\n### From boss — task [task #1]\nYou are assigned task #1: "
                                                "list the TODOs under src/ and report them."}]
        total, usd = Usage(), Decimal(0)
        for i in range(turns):
            reply = provider.complete(system, messages, specs, should_stop=lambda: False)
            for field in ("input", "output", "cache_read", "cache_write"):
                setattr(total, field, getattr(total, field) + getattr(reply.usage, field))
            usd += pricing.usd_for(model, reply.usage)
            calls = [{"id": c.id, "name": c.name, "args": c.args} for c in reply.tool_calls]
            messages.append({"role": "assistant", "content": reply.text, "tool_calls": calls})
            for c in calls:
                messages.append({"role": "tool", "tool_call_id": c["id"], "name": c["name"], "content": tool_result(i)})
            if not calls:
                break
        first = mock.model_requests()[0].body
    tools_bytes = len(json.dumps(first.get("tools") or []))
    request_bytes = len(json.dumps(first))
    prompt = total.input + total.cache_read + total.cache_write
    return {"layout": layout, "calls": len(mock.model_requests()), "prompt_tokens": prompt, "cache_read": total.cache_read,
            "cache_write": total.cache_write, "uncached": total.input, "share": total.cache_read / prompt if prompt else 0.0,
            "usd": usd, "tools_bytes": tools_bytes, "request_bytes": request_bytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--model", default="anthropic:claude-sonnet-4-5")
    parser.add_argument("--min-cache", type=int, default=1024, help="minimum cacheable prefix in tokens (Sonnet 1024)")
    args = parser.parse_args()
    setup()
    rows = [run(layout, args.turns, args.model, args.min_cache) for layout in ("none", "stable prefix", "+ conversation")]
    first = rows[0]
    print(f"{args.turns}-turn Anthropic scenario, {args.model}, mock cache minimum {args.min_cache} tokens")
    print(f"first request: {first['request_bytes']} bytes, of which tool schemas {first['tools_bytes']} bytes")
    print(f"{'layout':<16} {'calls':>5} {'prompt tok':>10} {'cache read':>10} {'cache write':>11} {'uncached':>9} "
          f"{'cached share':>12} {'USD':>9}")
    for r in rows:
        print(f"{r['layout']:<16} {r['calls']:>5} {r['prompt_tokens']:>10} {r['cache_read']:>10} {r['cache_write']:>11} "
              f"{r['uncached']:>9} {r['share']:>11.1%} {r['usd']:>9.4f}")
    saved = 1 - rows[-1]["usd"] / first["usd"] if first["usd"] else 0
    print(f"input cost saved by caching (as sent): {saved:.0%}")


if __name__ == "__main__":
    main()
