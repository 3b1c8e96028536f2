"""The command sandbox with real bubblewrap, run as the suite runs (root, like CI): no root and no
capability inside, bounded processes, memory, CPU, file size and RAM folders, output kept as a head
and a tail without ever being held whole, and a stop that reaches the running command (issue 21.2,
21.3, 23.1). The same for each door a command comes through: run_command, a verify check and an
MCP stdio server (Manage › Check runs it in the web process)."""
from __future__ import annotations

import os
import re
import shutil
import sys
import threading
import time
import tracemalloc
import uuid
from pathlib import Path

import pytest

from veronica.agent.mcp_client import manager
from veronica.agent.runctx import STOP
from veronica.agent.tools import ToolContext, ToolError
from veronica.agent.tools import workspace as ws
from veronica.agent.tools import mcp as mcp_tools
from veronica.agent.tools.mcp import check as mcp_check
from veronica.engine import checks, supervisor
from veronica.models import McpServer

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

# What a command inside reports about itself: its uid, its capabilities, whether it can remount /usr
# read-write, write to /usr (the host's), to the sandbox's own / and to /dev.
PROBE = ("echo uid=$(id -u); grep CapEff /proc/self/status; mount -o remount,rw,bind /usr >/dev/null 2>&1; echo mount=$?; "
         "touch /usr/{name} 2>/dev/null; echo usr=$?; touch /{name} 2>/dev/null; echo root=$?; "
         "touch /dev/{name} 2>/dev/null; echo dev=$?; echo hello > /workspace/{name}.txt; echo workspace=$?")


@pytest.fixture(autouse=True)
def sandbox(settings):
    settings.COMMAND_SANDBOX = "bwrap"
    yield settings
    manager().close_all()


@pytest.fixture
def ctx(space):
    return ToolContext(member=supervisor.get_member(space, "w1"), space=space)


@pytest.fixture
def probe_name():
    name = f"veronica-probe-{uuid.uuid4().hex[:8]}"
    yield name
    for leaked in (Path("/usr") / name, Path("/") / name):  # today's sandbox writes the host's /usr
        leaked.unlink(missing_ok=True)


def assert_confined(report: str, name: str, workdir: Path) -> None:
    uid = re.search(r"uid=(\d+)", report)
    assert uid and uid.group(1) != "0", f"the command ran as root: {report!r}"
    assert re.search(r"CapEff:\s+0000000000000000", report), f"the command kept capabilities: {report!r}"
    for probe in ("mount", "usr", "root", "dev"):
        assert f"{probe}=0" not in report, f"{probe} succeeded inside the sandbox: {report!r}"
    assert "workspace=0" in report
    assert not (Path("/usr") / name).exists(), "the host's /usr was written"
    assert (workdir / f"{name}.txt").read_text() == "hello\n"


# --- no root, no capability (21.2) ---------------------------------------------------------------------

def test_run_command_runs_without_root_or_capabilities(ctx, probe_name):
    out = ws.run_command(ctx, {"command": PROBE.format(name=probe_name)})
    assert_confined(out, probe_name, Path(ctx.space.workdir))


def test_a_verify_check_runs_without_root_or_capabilities(space, probe_name):
    result = checks.run_one(Path(space.workdir), {"name": "probe", "command": PROBE.format(name=probe_name), "timeout": 20})
    assert_confined(result["output"], probe_name, Path(space.workdir))


def test_an_mcp_stdio_server_runs_without_root_or_capabilities(space, probe_name):
    """What Manage › Check does: start the server and list its tools; it says what it is on stderr."""
    row = McpServer.objects.create(space=space, name="probe", transport="stdio", timeout=20,
                                   command=["sh", "-c", "{ " + PROBE.format(name=probe_name) + "; } >&2; exit 1"])
    assert mcp_check(row, space.workdir) is None
    row.refresh_from_db()
    assert "could not start" in row.last_error
    assert_confined(row.last_error.split("stderr: ", 1)[1], probe_name, Path(space.workdir))


# --- bounds (21.3) ----------------------------------------------------------------------------------------

def test_a_fork_bomb_is_contained_by_the_process_limit(ctx, sandbox):
    sandbox.SANDBOX_PROCS = 40
    command = "i=0; while [ $i -lt 200 ]; do sleep 5 & i=$((i+1)); done 2>/dev/null; ls /proc | grep -c '^[0-9]'"
    started = time.monotonic()
    with pytest.raises(ToolError, match=r"exceeded the 40 process limit \(VERONICA_SANDBOX_PROCS\): a fork was refused"):
        ws.run_command(ctx, {"command": command, "timeout": 20})
    assert time.monotonic() - started < 15, "the bomb ran to the timeout"


def test_a_big_allocation_fails_with_a_clear_error(ctx, sandbox):
    sandbox.SANDBOX_MEMORY_MB = 512
    with pytest.raises(ToolError, match=r"ran out of memory.*512 MB \(VERONICA_SANDBOX_MEMORY_MB\)"):
        ws.run_command(ctx, {"command": "python3 -c 'bytearray(1536 * 1024 * 1024)'"})


def test_a_huge_file_write_fails_with_a_clear_error(ctx, sandbox):
    sandbox.SANDBOX_FILE_MB = 5
    with pytest.raises(ToolError, match=r"exceeded the 5 MB file size limit \(VERONICA_SANDBOX_FILE_MB\)"):
        ws.run_command(ctx, {"command": "head -c 50000000 /dev/zero > big.bin"})
    assert (Path(ctx.space.workdir) / "big.bin").stat().st_size == 5 * 1024 * 1024


@pytest.mark.parametrize("folder", ["/tmp", "/dev/shm"])
def test_the_ram_folders_are_bounded(ctx, sandbox, folder):
    sandbox.SANDBOX_TMP_MB = 4
    with pytest.raises(ToolError, match=r"/tmp and /dev/shm hold 4 MB \(VERONICA_SANDBOX_TMP_MB\)"):
        ws.run_command(ctx, {"command": f"head -c 50000000 /dev/zero > {folder}/fill"})


def test_cpu_time_is_bounded(ctx, sandbox):
    sandbox.SANDBOX_CPU_SECONDS = 1
    with pytest.raises(ToolError, match=r"exceeded the 1 s CPU time limit \(VERONICA_SANDBOX_CPU_SECONDS\)"):
        ws.run_command(ctx, {"command": "while :; do :; done", "timeout": 20})


FLOOD = "echo FIRST-LINE; yes | head -c 200000000; echo LAST-LINE"


def peak_of(fn):
    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_flood_of_output_keeps_memory_bounded_and_the_head_and_tail(ctx):
    out, peak = peak_of(lambda: ws.run_command(ctx, {"command": FLOOD, "timeout": 30}))
    assert peak < 5_000_000, f"reading 200 MB of output peaked at {peak / 1e6:.0f} MB"
    assert out.startswith("exit 0\nFIRST-LINE") and out.rstrip().endswith("LAST-LINE")
    assert "bytes dropped from the middle" in out and len(out) < ws.COMMAND_OUTPUT_CAP + 300


def test_a_verify_checks_flood_keeps_memory_bounded_and_the_head_and_tail(space):
    result, peak = peak_of(lambda: checks.run_one(Path(space.workdir), {"name": "flood", "command": FLOOD, "timeout": 30}))
    assert peak < 5_000_000, f"reading 200 MB of output peaked at {peak / 1e6:.0f} MB"
    assert result["exit_code"] == 0 and result["output"].startswith("FIRST-LINE") and result["output"].endswith("LAST-LINE")


def test_an_mcp_servers_stderr_flood_keeps_memory_bounded(space, sandbox):
    sandbox.SANDBOX_FILE_MB = 0  # today's server stderr goes to a file: let it grow as it did
    row = McpServer.objects.create(space=space, name="loud", transport="stdio", timeout=30,
                                   command=["sh", "-c", "yes | head -c 100000000 >&2; echo LAST-WORDS >&2; exit 1"])
    checked, peak = peak_of(lambda: mcp_check(row, space.workdir))
    assert checked is None and peak < 5_000_000, f"100 MB of stderr peaked at {peak / 1e6:.0f} MB"
    row.refresh_from_db()
    assert "LAST-WORDS" in row.last_error


# --- a stop reaches the running command (23.1) -------------------------------------------------------------

def alive(marker: str) -> list[int]:
    """Host pids whose command line carries `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                pass
    return found


def stopped_after(seconds: float, fn):
    """Call fn as keep_alive would, with the run's STOP event set after `seconds`."""
    stop = threading.Event()
    threading.Timer(seconds, stop.set).start()
    token = STOP.set(stop)
    started = time.monotonic()
    try:
        with pytest.raises(ToolError, match="cancelled") as err:
            fn()
    finally:
        STOP.reset(token)
    return time.monotonic() - started, str(err.value)


@pytest.mark.parametrize("mode", ["bwrap", "none"])
def test_a_stop_kills_the_running_command_and_its_children_at_once(ctx, sandbox, mode):
    sandbox.COMMAND_SANDBOX = mode
    marker = f"{30 + uuid.uuid4().int % 1000 / 1000:.3f}"  # a sleep nobody else runs
    took, text = stopped_after(0.5, lambda: ws.run_command(ctx, {"command": f"sleep {marker} & sleep {marker}", "timeout": 30}))
    assert took < 1.5, f"the command ran on for {took:.1f} s after the stop"
    assert "the run was asked to stop" in text
    time.sleep(0.2)
    assert alive(f"sleep\x00{marker}") == [], "a process of the command outlived the stop"


def test_a_stop_abandons_an_mcp_call_in_flight(space, sandbox):
    from tests.engine.test_mcp import SERVER  # the SDK test server; it needs the host's virtualenv

    sandbox.COMMAND_SANDBOX = "none"
    row = McpServer.objects.create(space=space, name="calc", transport="stdio", timeout=30, command=[sys.executable, SERVER])
    spec, listed = mcp_check(row, space.workdir)
    pid_before = manager().connections[row.pk]
    took, text = stopped_after(0.5, lambda: mcp_tools._caller(spec, "nap", True)(None, {"seconds": 20}))
    assert took < 1.5 and "cancelled" in text
    assert pid_before.dead


def test_as_root_without_a_pids_cgroup_a_command_refuses_to_start_unless_the_limit_is_off(ctx, sandbox, monkeypatch, tmp_path):
    """RLIMIT_NPROC does not count root's processes: without a cgroup the process limit cannot hold."""
    from veronica.agent.tools import sandbox as box

    monkeypatch.setattr(box, "PIDS_V1", tmp_path / "no-cgroup")
    monkeypatch.setattr(box.os, "geteuid", lambda: 0)
    with pytest.raises(ToolError, match="VERONICA_SANDBOX_PROCS=0"):
        ws.run_command(ctx, {"command": "true"})
    sandbox.SANDBOX_PROCS = 0
    assert ws.run_command(ctx, {"command": "echo ran"}) == "exit 0\nran"


def test_commands_start_only_through_the_sandbox():
    """Every place that starts a process: the sandbox's run(), the MCP client (whose argv comes from
    sandboxed(), pinned in test_mcp), `up`, which starts the server's own web and worker processes, and
    the host's model gateway (a fixed argv: this interpreter, the module and a socket path of its own)."""
    repo = Path(__file__).resolve().parents[2]
    starts = re.compile(r"subprocess|Popen|open_process|stdio_client|os\.system|os\.exec|os\.spawn|create_subprocess|\bpty\.")
    found = {str(p.relative_to(repo)) for p in (repo / "veronica").rglob("*.py") if starts.search(p.read_text())}
    assert found == {"veronica/agent/tools/sandbox.py", "veronica/agent/mcp_client.py", "veronica/management/commands/up.py",
                     "veronica/agent/providers/gateway.py"}
