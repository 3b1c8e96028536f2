"""A stop reaches the running command on the real django-q2 cluster (issue 23.1): suspending or
removing a member while its run_command sleeps ends the run within two seconds, kills the command's
processes and tells the model the call was cancelled (a scripted fake vendor, see fake_cluster.py)."""
from __future__ import annotations

import shutil
import time
import uuid

import pytest

from tests.conftest import make_space
from tests.engine.test_cluster_faults import fake_cluster, fresh, isolate_queue
from tests.engine.test_sandbox import alive
from tests.harness import wait_for
from veronica.swarm import bus
from veronica.engine import supervisor
from veronica.models import Run, RunOutcome, Turn

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def own_queue():
    isolate_queue()


def stop_mid_command(tmp_path, stop, sandbox: str) -> tuple[float, str, Run]:
    """Start `sleep` in a run, stop the member once it sleeps; (seconds to the run's end, marker, run)."""
    space = make_space(tmp_path, workers=("w1",))
    w1 = supervisor.get_member(space, "w1")
    marker = f"{30 + uuid.uuid4().int % 1000 / 1000:.3f}"  # a sleep nobody else runs
    with fake_cluster(f"cmd:sleep {marker} & sleep {marker},text:done", tmp_path / "calls", workers=1,
                      VERONICA_COMMAND_SANDBOX=sandbox):
        bus.send(space, "boss", "w1", "run the slow build")
        wait_for(lambda: len(alive(f"sleep\x00{marker}")) == 2, 30, message="the command to sleep")
        asked = time.monotonic()
        stop(fresh(w1))
        run = wait_for(lambda: Run.objects.filter(member=w1, ended_at__isnull=False).first(), 30, message="the run to end")
        took = time.monotonic() - asked
    print(f"run ended {took:.2f} s after the stop ({sandbox})")
    return took, marker, run


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
def test_a_suspend_during_run_command_ends_the_run_and_the_command_at_once(tmp_path, sandbox):
    if sandbox == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("needs bubblewrap")
    took, marker, run = stop_mid_command(tmp_path, lambda m: supervisor.suspend(m, actor="test"), sandbox)
    assert took < 2, f"the run ended {took:.1f} s after the suspend"
    assert run.outcome == RunOutcome.ABORTED
    assert alive(f"sleep\x00{marker}") == [], "the command outlived the suspend"
    result = Turn.objects.get(session__member=run.member, role="tool").content
    assert result.startswith("error: cancelled") and "killed" in result, result


def test_removing_a_member_mid_command_ends_the_run_and_the_command_at_once(tmp_path):
    took, marker, run = stop_mid_command(tmp_path, lambda m: supervisor.remove_member(m, actor="test"), "none")
    assert took < 2, f"the run ended {took:.1f} s after the removal"
    assert run.outcome == RunOutcome.ABORTED
    assert alive(f"sleep\x00{marker}") == []
