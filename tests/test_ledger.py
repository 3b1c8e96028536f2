from datetime import timedelta

import pytest
from django.utils import timezone

from veronica.swarm import ledger
from veronica.engine import supervisor
from veronica.plumbing.errors import IllegalTransition, VeronicaError
from veronica.models import Message, Task, TaskStatus


def test_new_task_without_deps_is_ready_and_with_deps_pending(space):
    a = ledger.create_task(space, "boss", "a")
    b = ledger.create_task(space, "boss", "b", depends_on=[a.pk])
    assert a.status == "ready" and b.status == "pending"


def test_illegal_transition_raises_and_leaves_the_row_as_it_was(space):
    task = ledger.create_task(space, "boss", "t")
    before = Task.objects.filter(pk=task.pk).values().get()
    with pytest.raises(IllegalTransition) as err:
        ledger.transition(task, TaskStatus.DONE, actor="boss")
    assert "cannot go from ready to done" in str(err.value)
    assert Task.objects.filter(pk=task.pk).values().get() == before


def test_done_is_terminal(space):
    w1 = supervisor.get_member(space, "w1")
    task = ledger.create_task(space, "boss", "t", assignee=w1)
    ledger.complete(task, actor="w1", result="ok")
    with pytest.raises(IllegalTransition, match="terminal"):
        ledger.transition(task, TaskStatus.RUNNING, actor="boss")


def test_stale_object_transition_is_refused(space):
    task = ledger.create_task(space, "boss", "t")
    stale = Task.objects.get(pk=task.pk)
    ledger.transition(task, TaskStatus.CANCELLED, actor="boss")
    with pytest.raises(IllegalTransition):
        ledger.transition(stale, TaskStatus.RUNNING, actor="boss")
    assert Task.objects.get(pk=task.pk).status == "cancelled"


def test_manual_and_automatic_assignment_share_one_body(space):
    w1 = supervisor.get_member(space, "w1")
    manual = ledger.create_task(space, "boss", "probe", spec="look at x", assignee=w1)
    first = ledger.create_task(space, "boss", "first")
    auto = ledger.create_task(space, "boss", "probe", spec="look at x", depends_on=[first.pk])
    ledger.assign(auto, w1, actor="boss")
    assert Task.objects.get(pk=auto.pk).status == "pending"
    ledger.dispatch_ready(space)
    assert Task.objects.get(pk=auto.pk).status == "pending"  # dependency not done yet
    ledger.transition(first, "running", actor="boss")
    ledger.transition(first, "done", actor="boss")
    assert Task.objects.get(pk=auto.pk).status == "ready"
    started = ledger.dispatch_ready(space)
    assert [t.pk for t in started] == [auto.pk]
    manual_mail = Message.objects.get(task=manual, recipient=w1)
    auto_mail = Message.objects.get(task=auto, recipient=w1)
    assert "(auto-dispatched)" in auto_mail.body and "(auto-dispatched)" not in manual_mail.body
    strip = lambda body, t: body.replace(f"#{t.pk}", "#N").replace(" (auto-dispatched)", "").split("\n\nNo leader run")[0]
    assert strip(manual_mail.body, manual).splitlines()[:3] == strip(auto_mail.body, auto).splitlines()[:3]


def test_not_before_holds_a_task_until_due(space):
    w1 = supervisor.get_member(space, "w1")
    later = ledger.create_task(space, "boss", "later", not_before=timezone.now() + timedelta(hours=1), assignee=w1)
    assert later.status == "pending"
    ledger.dispatch_ready(space)
    assert Task.objects.get(pk=later.pk).status == "pending"
    Task.objects.filter(pk=later.pk).update(not_before=timezone.now() - timedelta(seconds=1))
    ledger.dispatch_ready(space)
    assert Task.objects.get(pk=later.pk).status == "running"


def test_completion_mails_the_creator_and_verify_leader_holds_in_verifying(space):
    w1 = supervisor.get_member(space, "w1")
    task = ledger.create_task(space, "boss", "t", assignee=w1, verify_policy="leader")
    ledger.complete(task, actor="w1", result="found 3 bugs")
    assert Task.objects.get(pk=task.pk).status == "verifying"
    assert Message.objects.filter(recipient__name="boss", body__contains="found 3 bugs").exists()


def test_bad_dependency_is_refused(space):
    with pytest.raises(VeronicaError) as err:
        ledger.create_task(space, "boss", "t", depends_on=[9999])
    assert err.value.field == "depends_on" and not Task.objects.exists()


def test_a_dispatched_task_wakes_its_assignee_with_the_task_source(space, monkeypatch, django_capture_on_commit_callbacks):
    from veronica.swarm import bus
    from veronica.agent.prompt import wake_brief
    from veronica.engine import wakes

    rung = []
    monkeypatch.setattr(wakes, "enqueue_wake", lambda member_id, source: rung.append(source))
    w1, w2 = supervisor.get_member(space, "w1"), supervisor.get_member(space, "w2")
    with django_capture_on_commit_callbacks(execute=True):
        ledger.create_task(space, "boss", "probe", assignee=w1)
        bus.send(space, "boss", "w2", "hello")
    assert rung == ["task", "message"]
    assert wake_brief(w1, rung[0], []).startswith("# Wake: a task was dispatched to you")
