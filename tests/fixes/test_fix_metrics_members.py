"""/metrics labels wakes, runs, tokens and spend per member, and exports the engine's counts."""
import re

import pytest
from django.contrib.auth.models import User

from tests.fixes.test_fix_current_task import tool
from veronica.swarm import bus, ledger
from veronica.engine.drive import run_until_quiet
from veronica.models import Task


@pytest.fixture
def staff(client, db):
    from django.contrib.auth.models import Permission

    prom = User.objects.create_user("prom", is_staff=True)  # staff see the spaces their permissions grant
    prom.user_permissions.add(Permission.objects.get(content_type__app_label="veronica", codename="view_space"))
    client.force_login(prom)
    return client


def value(text: str, series: str) -> float:
    match = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
    assert match, f"{series} not in /metrics"
    return float(match.group(1))


def test_runs_wakes_and_tokens_per_member(space, staff):
    bus.send(space, bus.OPERATOR, "w2", "Please list the workspace.")
    run_until_quiet(space, timeout=60)
    text = staff.get("/metrics").content.decode()
    assert value(text, 'veronica_member_runs_total{space="alpha",member="w2",outcome="done"}') == 1
    assert value(text, 'veronica_member_wakes_total{space="alpha",member="w2",source="message",claimed="true"}') == 1
    w2_input = value(text, 'veronica_member_tokens_total{space="alpha",member="w2",class="input"}')
    assert w2_input > 0 and w2_input == value(text, 'veronica_tokens_total{space="alpha",class="input"}')
    assert 'member="w1"' not in "\n".join(line for line in text.splitlines() if "member_runs_total{" in line)
    assert 'veronica_member_usd_total{space="alpha",member="w2"}' in text


def test_engine_counts_dispatched_spawned_and_retired(space, staff):
    tool(space, "boss", "task_create", title="first", assignee="w1")
    first = Task.objects.get(title="first")
    tool(space, "boss", "task_create", title="second", assignee="w2", depends_on=[first.pk])
    tool(space, "w1", "task_done", task_id=first.pk, result="ok")
    assert [t.title for t in ledger.dispatch_ready(space)] == ["second"]  # the engine tick's duty
    assert "spawned w1-1" in tool(space, "boss", "member_spawn", base="w1", retire="manual")
    assert "retired w1-1" in tool(space, "boss", "member_retire", member="w1-1")
    assert "spawned w1-2" in tool(space, "boss", "member_spawn", base="w1")
    text = staff.get("/metrics").content.decode()
    assert value(text, 'veronica_engine_total{space="alpha",kind="dispatched"}') == 1
    assert value(text, 'veronica_engine_total{space="alpha",kind="spawned"}') == 2
    assert value(text, 'veronica_engine_total{space="alpha",kind="retired"}') == 1
