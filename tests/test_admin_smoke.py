"""Every registered admin page opens (changelist, add, change, history, delete confirmation) for a
fixture object of each model, and every change form saved unmodified redirects and changes nothing:
no 500, no event, no rule history, the row as it was (django-q2's tests/test_admin.py, all models)."""
from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from cryptography.fernet import Fernet
from django.contrib import admin
from django.contrib.auth.models import Group, User
from django.db.models import DateTimeField
from django.forms.models import model_to_dict
from django.urls import reverse
from django.utils import timezone
from django_q.models import OrmQ, Schedule, Success
from django_q.models import Failure as QFailure

from learning import api as learning
from learning.models import RuleChange, WriterLease
from learning.sources import Correction, SessionItem, StaticSource
from tests.admin_forms import form_data
from tests.console.helpers import pending_approval
from veronica.swarm import access, blackboard, bus, ledger, mcp_servers, memory, secrets, skills
from veronica.engine import alarms, budget, supervisor
from veronica.models import (
    Event, Member, NotificationDelivery, Run, Space, SpaceAccess, SsoIdentity, Task, TaskCheck, WebhookDelivery,
)
from waggle.models import ForageCall, LedgerEntry, Waggle
from waggle.route import Route, Step, render_script


@pytest.fixture
def root(client, db) -> User:
    user = User.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(user)
    return user


def _learning_rows(space: Space) -> None:
    """Domains, rules, a proposal, its reflection, mined items and pass runs, through learning's API."""
    source = StaticSource(session_items=[SessionItem("s1", "alice", ["ops"], "operator: never push to main")],
                          correction_items=[Correction("c1", ["ops"], "approval denied: do not run rm -rf; reason: it deletes")],
                          routed={"ops"})
    learning.run_reflect(source)
    learning.run_learn()
    learning.add_user_rule("ops", "Keep commits small.", actor="test")
    WriterLease.objects.get_or_create(name="learning")


def _waggle_rows() -> None:
    steps = (Step("list_dir", binds=(("path", "path"),)), Step("grep", literals=(("pattern", "p"),), binds=(("path", "path"),)))
    route = Route(steps=steps, params=("path",))
    route = Route(steps=route.steps, params=route.params, name=route.stable_name(), scope="space")
    w = Waggle.objects.create(name=route.name, scope="space", space_key="1", route=route.to_json(), script=render_script(route), length=2)
    LedgerEntry.objects.create(name=w.name, scope="space", store_key="1", space_key="1", steps=1, yield_tokens=10)
    ForageCall.objects.create(space_key="1", session_key="s1", member_key="m1", seq=1, tool="list_dir", args={"path": "."})


def _engine_rows(space: Space, w1: Member, task: Task) -> None:
    """Rows only the engine writes (runs, check evidence, deliveries, webhook receipts, the queue)."""
    now = timezone.now()
    Run.objects.create(member=w1, source="mail", lease_token="t", started_at=now, ended_at=now, outcome="done", steps=2)
    TaskCheck.objects.create(task=task, space=space, attempt=1, name="tests", passed=True, exit_code=0, duration_ms=5, output="ok")
    NotificationDelivery.objects.create(space=space, seq=1, channel="webhook", target="https://example.com/h", subject="s")
    WebhookDelivery.objects.create(space=space, signature="ab" * 32, member_name="w1")
    for model in (Success, QFailure):
        model.objects.create(id=f"{model.__name__.lower()}-1", name=model.__name__, func="math.floor", started=now, stopped=now,
                             success=model is Success)
    OrmQ.objects.create(key="veronica", payload="x", lock=now)
    kwargs = dict(ip_address="127.0.0.1", user_agent="ua", username="root", http_accept="*/*", path_info="/admin/login/")
    AccessAttempt.objects.create(get_data="", post_data="", failures_since_start=1, **kwargs)
    AccessLog.objects.create(**kwargs)
    AccessFailureLog.objects.create(**kwargs)


@pytest.fixture
def every_model(root, space, tmp_path, settings) -> Space:
    """At least one row of every model the admin registers, made through the verbs where one exists."""
    w1, w2 = supervisor.get_member(space, "w1"), supervisor.get_member(space, "w2")
    bus.send(space, "boss", "w1", "hello")
    first = ledger.create_task(space, "boss", "first", assignee=w2)
    ledger.create_task(space, "boss", "second", depends_on=[first.pk], assignee=w1)
    skills.add_skill(space, "notes", "# Notes", description="shared notes")
    skills.add_skill(space, "mine", "# Mine", member=w1)
    supervisor.set_schedule(w1, "0 9 * * *", actor="test")
    pending_approval(space)
    blackboard.write(space, "boss", "plan")
    budget.meter(w1, input_tokens=10, output_tokens=5)
    alarms.set_alarm(w1, timezone.now() + timedelta(hours=1), "stand-up", created_by="boss")
    User.objects.create_user("ann")
    access.grant(space, "ann", "owner", actor="test")
    access.create_token(User.objects.get(username="ann"), "ci")
    memory.write(w1, "notes.md", "# remember", actor="test")
    mcp_servers.add(space, mcp_servers.check({"name": "srv", "command": ["python3", "-m", "srv"]}), actor="test")
    Group.objects.create(name="ops")
    settings.SECRETS_KEYS = [Fernet.generate_key().decode()]
    secrets.set_secret(space, "API_KEY", "an-api-key-value", actor="test")
    # linked at a first SSO login (veronica.web.sso, tests/oidc): no verb of its own
    SsoIdentity.objects.create(user=User.objects.get(username="ann"), issuer="https://idp.example.org", subject="ann")
    _engine_rows(space, w1, first)
    _learning_rows(space)
    _waggle_rows()
    return space


REVIEW_PAGES = {"learning.Proposal"}  # its change page is the approve / reject screen, with no form to save


def _url(model, view: str, *args) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


def _request(user: User):
    return type("Request", (), {"user": user, "method": "GET", "GET": {}, "POST": {}})()


def _state(obj) -> dict:
    """The row as stored, without the columns a save stamps (auto_now); the admin's date and time
    inputs carry whole seconds, as a browser submits them (see _as_submitted)."""
    stamped = {f.name for f in obj._meta.concrete_fields if isinstance(f, DateTimeField) and f.auto_now}
    fresh = type(obj)._base_manager.get(pk=obj.pk)
    return {k: _as_submitted(v) for k, v in model_to_dict(fresh).items() if k not in stamped}


def _as_submitted(value):
    """A form round trip keeps whole seconds and turns a null text column into '' (django-q's Schedule)."""
    if isinstance(value, datetime):
        return value.replace(microsecond=0)
    return "" if value is None else value


def _tallies() -> tuple[int, int, int]:
    return Event.objects.count(), RuleChange.objects.count(), SpaceAccess.objects.count()


@pytest.mark.parametrize("model", list(admin.site._registry), ids=lambda m: m._meta.label)
def test_every_admin_page_opens_and_an_unmodified_save_changes_nothing(client, root, every_model, model):
    model_admin = admin.site._registry[model]
    request = _request(root)
    assert client.get(_url(model, "changelist")).status_code == 200
    if model_admin.has_add_permission(request):
        assert client.get(_url(model, "add")).status_code == 200
    obj = model._default_manager.order_by("pk").first()
    assert obj is not None, f"the fixture has no {model._meta.label} row"
    change = _url(model, "change", obj.pk)
    page = client.get(change)
    assert page.status_code == 200, change
    assert client.get(_url(model, "history", obj.pk)).status_code == 200
    if model_admin.has_delete_permission(request, obj):
        assert client.get(_url(model, "delete", obj.pk)).status_code == 200
    if not model_admin.has_change_permission(request, obj):
        return
    html, form_id = page.content.decode(), f"{model._meta.model_name}_form"
    if f'id="{form_id}"' not in html:
        assert model._meta.label in REVIEW_PAGES, f"{change} shows no change form"
        return
    data = form_data(html, form_id)
    before, tallies = _state(obj), _tallies()
    response = client.post(change, {**data, "_save": "Save"})
    form = response.context.get("adminform").form if response.status_code == 200 and response.context.get("adminform") else None
    assert response.status_code == 302, (change, form.errors if form else response.content[:500])
    assert _tallies() == tallies, f"an unmodified save of {model._meta.label} emitted something"
    assert _state(obj) == before
