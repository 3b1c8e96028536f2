"""A schedule edited in the Django admin goes through the schedule verb: armed, origin runtime."""
import json

import pytest
from django.contrib.auth.models import User
from django.forms.models import model_to_dict
from django.urls import reverse
from django_q.models import Schedule

from veronica.engine import supervisor
from veronica.models import Event, Origin


@pytest.fixture
def staff_client(client, db):
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


def _post_change(client, member, **changes):
    data = {k: v for k, v in model_to_dict(member).items() if v is not None}
    data["rule_domains"] = json.dumps(data.get("rule_domains") or [])
    data.update(changes)
    url = reverse("admin:veronica_member_change", args=[member.pk])
    response = client.post(url, data)
    assert response.status_code == 302, response.content.decode()[:2000]


def test_admin_schedule_edit_arms_the_next_firing(staff_client, space):
    member = supervisor.get_member(space, "w1")
    _post_change(staff_client, member, schedule="*/5  * * * *")
    member.refresh_from_db()
    assert member.schedule == "*/5 * * * *"
    assert member.schedule_next_at is not None
    assert member.schedule_origin == Origin.RUNTIME and member.schedule_set_at is not None
    assert Schedule.objects.filter(name__startswith=f"veronica-cron-{member.pk}-").count() == 1
    event = Event.objects.filter(space=space, kind="member.schedule_set").last()
    assert event is not None and event.payload.get("actor") == "admin:root"


def test_admin_schedule_blanked_writes_the_tombstone(staff_client, space):
    member = supervisor.set_schedule(supervisor.get_member(space, "w1"), "0 * * * *", actor="test")
    _post_change(staff_client, member, schedule="")
    member.refresh_from_db()
    assert member.schedule == "" and member.schedule_tombstone and member.schedule_next_at is None
    assert not Schedule.objects.filter(name__startswith=f"veronica-cron-{member.pk}-").exists()


def test_admin_edit_without_schedule_change_leaves_it_alone(staff_client, space):
    member = supervisor.get_member(space, "w1")
    _post_change(staff_client, member, persona="new persona")
    member.refresh_from_db()
    assert member.persona == "new persona" and member.schedule_set_at is None
    assert not Event.objects.filter(space=space, kind__startswith="member.schedule").exists()
