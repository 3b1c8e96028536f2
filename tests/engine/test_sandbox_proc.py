"""The sandbox's /proc is read-only (found by bench/attack.py after issue 21.2's fix): the command runs
as uid 1000 inside, which bwrap maps to the server's own uid, root here. bwrap covers /proc/sys only
when it is writable by mode, so a capability-less command still wrote host-wide sysctls
(kernel.core_pattern = "|/workspace/x" runs x as host root at the next crash anywhere on the host).
The probe writes printk_ratelimit with the value it already has and only opens core_pattern: the
host is never changed, whatever the outcome."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from veronica.agent.tools import ToolContext
from veronica.agent.tools import workspace as ws
from veronica.engine import checks, supervisor

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

PROBE = ("v=$(cat /proc/sys/kernel/printk_ratelimit); echo \"$v\" > /proc/sys/kernel/printk_ratelimit 2>/dev/null; echo sysctl=$?; "
         "python3 -c \"import os\ntry: os.close(os.open('/proc/sys/kernel/core_pattern', os.O_WRONLY)); print('core_pattern=0')\n"
         "except OSError as e: print('core_pattern=%d' % e.errno)\"; cat /proc/self/status >/dev/null; echo proc_read=$?")


@pytest.fixture(autouse=True)
def sandbox(settings):
    settings.COMMAND_SANDBOX = "bwrap"
    return settings


def assert_no_host_sysctl(report: str) -> None:
    assert "sysctl=0" not in report, f"the command wrote a host sysctl: {report!r}"
    assert "core_pattern=0" not in report, f"the command may rewrite kernel.core_pattern: {report!r}"
    assert "proc_read=0" in report, f"/proc must stay readable: {report!r}"


def test_run_command_cannot_write_host_sysctls(space):
    ctx = ToolContext(member=supervisor.get_member(space, "w1"), space=space)
    assert_no_host_sysctl(ws.run_command(ctx, {"command": PROBE}))


def test_a_verify_check_cannot_write_host_sysctls(space):
    result = checks.run_one(Path(space.workdir), {"name": "probe", "command": PROBE, "timeout": 20})
    assert_no_host_sysctl(result["output"])
