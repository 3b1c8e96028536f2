"""A django-q2 cluster whose members talk to a scripted fake vendor instead of a model.

    VERONICA_FAKE_PLAN="tool:list_dir,err:529,text:done"   one step per model call, in order,
                                                           across every worker; the last repeats
    VERONICA_FAKE_STATE=/path/to/counter                   the call counter (the test reads it)

Steps: text:ANSWER, tool:NAME (no args), cmd:SHELL (run_command), err:STATUS (transient),
perm:STATUS (permanent), empty, slow:SECONDS (an answer after SECONDS of wall time that does not
poll for a stop: a vendor call that completes whatever happened meanwhile). Run as `python tests/engine/fake_cluster.py` from the repository.
"""
from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def next_call(state: Path) -> int:
    """The call number across all worker processes (a file counter under an exclusive lock)."""
    with open(state, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        count = int(handle.read().strip() or 0)
        handle.seek(0)
        handle.truncate()
        handle.write(str(count + 1))
        return count


def calls_made(state: Path) -> int:
    return int(state.read_text().strip() or 0) if state.exists() else 0


class PlanProvider:
    label = "fake vendor (test plan)"

    def complete(self, system, messages, tools, *, should_stop, on_event=None):
        from veronica.agent.providers.base import ProviderError, Reply, ToolCall, Usage

        n = next_call(Path(os.environ["VERONICA_FAKE_STATE"]))
        plan = os.environ["VERONICA_FAKE_PLAN"].split(",")
        kind, _, arg = plan[min(n, len(plan) - 1)].partition(":")
        usage = Usage(input=100, output=10)
        if kind == "err":
            raise ProviderError(f"HTTP {arg} from the fake vendor", status=int(arg), request_id=f"req_{n}")
        if kind == "perm":
            raise ProviderError(f"HTTP {arg} from the fake vendor", permanent=True, status=int(arg), request_id=f"req_{n}")
        if kind == "slow":
            import time

            deadline = time.time() + float(arg)  # wall time: a SIGSTOP spent inside it counts
            while time.time() < deadline:
                time.sleep(0.05)
            return Reply(text="the slow answer", usage=usage, finish_reason="stop")
        if kind == "empty":
            return Reply(text="", usage=usage, finish_reason="stop")
        if kind == "tool":
            return Reply(tool_calls=[ToolCall(id=f"f{n}", name=arg, args={})], usage=usage, finish_reason="tool_calls")
        if kind == "cmd":
            return Reply(tool_calls=[ToolCall(id=f"f{n}", name="run_command", args={"command": arg, "timeout": 30})],
                         usage=usage, finish_reason="tool_calls")
        return Reply(text=arg or "done", usage=usage, finish_reason="stop")


def main() -> None:
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "veronica.settings")
    import django

    django.setup()
    import veronica.agent.loop as loop

    loop.get_provider = lambda spec: PlanProvider()  # q2 forks its workers: they inherit this
    from django.core.management import execute_from_command_line

    execute_from_command_line(["manage.py", "qcluster"])


if __name__ == "__main__":
    main()
