"""CPU of one model call in the worker (issue 25): a loop of `--calls` calls of a provider's complete()
against the mock vendor (OpenAI, or --vendor anthropic) in a process of its own (no latency, `--steps 5`, lean), one call at a
time, so the CPU this process uses during a call (its caller and any helper thread) is that call's.

Printed: median and mean CPU µs per call (time.process_time around each complete(), after `--warmup`
calls), and wall µs. With --profile, yappi's CPU clock over every thread and the functions with most
total time. With --gateway, each call goes through a model gateway process, as a q2 worker's do
(veronica.agent.providers.gateway; its CPU is not counted here). Figures are absolute: run it on each
branch and compare.

  .venv/bin/python bench/model_call_cpu.py [--calls 500] [--vendor anthropic] [--gateway] [--profile]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._setup import REPO, django_setup  # noqa: E402

SYSTEM = "You are a careful engineer on a small team. " * 40  # a persona of about 1.7 KB
TOOLS = [{"name": f"tool_{i}", "description": f"Does thing number {i} to a file of the workspace.",
          "parameters": {"type": "object", "properties": {"path": {"type": "string", "description": "a path"},
                                                           "depth": {"type": "integer"}}, "required": ["path"]}}
         for i in range(12)]


def conversation(turns: int) -> list[dict]:
    """A brief, then `turns` tool calls and their results (the mock answers with another call until 4)."""
    messages = [{"role": "user", "content": "List the workspace, then summarise it."}]
    for i in range(turns):
        messages.append({"role": "assistant", "content": "", "tool_calls": [{"id": f"c{i}", "name": "tool_1", "args": {"path": "."}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": "a.txt\nb.txt\n" * 20})
    return messages


def start_mock(vendor: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", f"tests.vendors.mock_{vendor}", "--port", "0", "--key", "k",
                             "--latency", "0", "--steps", "5", "--lean"], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    return proc, proc.stdout.readline().strip()


def measure(provider, calls: int, warmup: int) -> tuple[list[float], list[float]]:
    cpu, wall = [], []
    for n in range(warmup + calls):
        messages = conversation(n % 5)
        c0, w0 = time.process_time(), time.perf_counter()
        reply = provider.complete(SYSTEM, messages, TOOLS, should_stop=lambda: False, on_event=None)
        c1, w1 = time.process_time(), time.perf_counter()
        assert reply.finish_reason in ("stop", "tool_calls"), reply
        if n >= warmup:
            cpu.append((c1 - c0) * 1e6)
            wall.append((w1 - w0) * 1e6)
    return cpu, wall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--profile", action="store_true", help="yappi (CPU clock, all threads): the top functions")
    parser.add_argument("--top", type=int, default=35)
    parser.add_argument("--vendor", choices=("openai", "anthropic"), default="openai")
    parser.add_argument("--gateway", action="store_true", help="through a model gateway process, as a q2 worker")
    args = parser.parse_args()

    django_setup()
    from veronica.agent.providers import gateway, sdk
    from veronica.agent.providers.anthropic import AnthropicProvider
    from veronica.agent.providers.openai_compat import OpenAIProvider

    proc, root = start_mock(args.vendor)
    relay = gateway.spawn() if args.gateway else None
    if args.gateway and relay is None:
        raise SystemExit("the model gateway did not start")
    try:
        cfg = sdk.CallConfig(timeout=30, max_retries=0)
        provider = (OpenAIProvider("mock-model", root + "/v1", "k", cfg=cfg) if args.vendor == "openai" else
                    AnthropicProvider("mock-model", root, "k", cfg=cfg))
        measure(provider, args.warmup, 0)  # imports, the shard client, its connection: not a call's cost
        if args.profile:
            import yappi

            yappi.set_clock_type("cpu")
            yappi.start()
        cpu, wall = measure(provider, args.calls, 0)
        if args.profile:
            yappi.stop()
            stats = yappi.get_func_stats()
            stats.sort("ttot")
            for f in list(stats)[:args.top]:
                print(f"{f.ttot / args.calls * 1e6:9.0f} µs/call tot {f.tsub / args.calls * 1e6:8.0f} sub  "
                      f"{f.ncall / args.calls:7.1f}x  {f.module.split('site-packages/')[-1]}:{f.lineno} {f.name}")
    finally:
        proc.kill()
        proc.wait(timeout=10)
        if relay is not None:
            gateway.stop(relay)
    print(f"{args.vendor} model call{' via the gateway' if relay else ''} CPU: median {statistics.median(cpu):.0f} µs, mean {statistics.mean(cpu):.0f} µs, "
          f"p90 {sorted(cpu)[int(len(cpu) * 0.9)]:.0f} µs over {len(cpu)} calls "
          f"(wall median {statistics.median(wall):.0f} µs)")


if __name__ == "__main__":
    main()
