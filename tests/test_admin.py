"""Open every admin page (changelist, add, change) as a superuser; changelists have pinned query counts."""
import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.urls import reverse

from veronica.swarm import bus, ledger, skills
from veronica.engine import supervisor
from veronica.models import Member


@pytest.fixture
def staff_client(client, db):
    user = User.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(user)
    return client


@pytest.fixture
def busy_space(space):
    for i in range(5):
        bus.send(space, "boss", "w1", f"msg {i}")
        ledger.create_task(space, "boss", f"task {i}", assignee=supervisor.get_member(space, "w2"))
    skills.add_skill(space, "notes", "# Notes\n<script>alert(1)</script>\n**bold**")
    return space


def test_every_admin_page_opens(staff_client, busy_space):
    for model, model_admin in admin.site._registry.items():
        meta = model._meta
        url = reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")
        assert staff_client.get(url).status_code == 200, url
        if model_admin.has_add_permission(type("R", (), {"user": User.objects.get(username="root")})()):
            assert staff_client.get(reverse(f"admin:{meta.app_label}_{meta.model_name}_add")).status_code == 200
        obj = model.objects.first()
        if obj is not None:
            url = reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[obj.pk])
            assert staff_client.get(url).status_code == 200, url


@pytest.mark.parametrize("name", ["message", "event", "task", "member", "space", "skill"])
def test_changelists_do_not_grow_queries_with_rows(staff_client, busy_space, django_assert_max_num_queries, name):
    url = reverse(f"admin:veronica_{name}_changelist")
    staff_client.get(url)
    with django_assert_max_num_queries(14):
        assert staff_client.get(url).status_code == 200
    for i in range(10):
        bus.send(busy_space, "boss", "w2", f"more {i}")
        ledger.create_task(busy_space, "boss", f"more {i}", assignee=supervisor.get_member(busy_space, "w1"))
    with django_assert_max_num_queries(14):
        assert staff_client.get(url).status_code == 200


def test_skill_preview_is_sanitized(staff_client, busy_space):
    skill = busy_space.skills.get(name="notes")
    html = staff_client.get(reverse("admin:veronica_skill_change", args=[skill.pk])).content.decode()
    assert "<strong>bold</strong>" in html
    assert "<script>alert(1)</script>" not in html


def test_freeze_action_calls_the_verb(staff_client, busy_space):
    w1 = Member.objects.get(space=busy_space, name="w1")
    staff_client.post(reverse("admin:veronica_member_changelist"), {"action": "freeze", "_selected_action": [w1.pk]})
    w1.refresh_from_db()
    assert w1.membership == "frozen"
    assert busy_space.events.filter(kind="member.frozen").exists()


def test_adding_a_task_in_the_admin_goes_through_the_ledger(staff_client, busy_space):
    from veronica.models import Task

    w1 = Member.objects.get(space=busy_space, name="w1")
    response = staff_client.post(reverse("admin:veronica_task_add"), {
        "space": busy_space.pk, "title": "from admin", "spec": "", "assignee": w1.pk, "creator_name": "x",
        "verify_policy": "auto", "check_evidence": "", "result": "", "status_reason": ""})
    assert response.status_code == 302, response.content[:2000]
    task = Task.objects.get(title="from admin")
    assert task.status == "running" and task.messages.filter(recipient=w1).exists()


def test_adding_a_second_leader_in_the_admin_is_refused(staff_client, busy_space):
    response = staff_client.post(reverse("admin:veronica_member_add"), {
        "space": busy_space.pk, "name": "boss2", "role": "leader", "model": "offline", "permission_mode": "bypass",
        "max_iterations": 24, "rule_domains": "[]"})
    assert Member.objects.filter(space=busy_space, role="leader").count() == 1
    assert response.status_code == 200 and b"at most one" in response.content
