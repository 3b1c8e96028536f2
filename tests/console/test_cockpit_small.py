"""The smaller cockpit items (issue 22.9): markdown that reads agent text as meant (still sanitized),
3-line goals, phase ages, a reason to reject a learned rule, thousands separators, the favicon and
"webhook deliveries"."""
from __future__ import annotations

from datetime import datetime, timezone as tz

import pytest
from django.urls import reverse

from learning import api as learning
from learning.models import Rule, RuleChange
from learning.sources import Correction, StaticSource
from veronica.swarm import bus
from veronica.engine import budget, supervisor
from veronica.plumbing.markdown import render_markdown
from veronica.models import Member, WebhookDelivery


# --- markdown -------------------------------------------------------------------------------------------------

def test_an_issue_number_in_a_list_is_not_a_heading():
    html = render_markdown("- #1 [done] write the tests\n- #2 [ready] ship it\n#3 alone\n1. #4 numbered")
    assert "<h1>" not in html and "#1 [done] write the tests" in html and "#3 alone" in html and "#4 numbered" in html
    assert render_markdown("# A heading") == "<h1>A heading</h1>" and render_markdown("## Two") == "<h2>Two</h2>"


def test_a_dunder_file_name_is_not_bold_and_code_is_shown_as_written():
    html = render_markdown("edit __init__.py and __main__, see `__init__.py` and **bold** __Strong words__")
    assert "__init__.py" in html and "__main__" in html and "<code>__init__.py</code>" in html
    assert html.count("<strong>") == 2, "real bold still renders"
    fenced = render_markdown("```\n#include <x>\n__init__.py\n```")
    assert "#include &lt;x&gt;\n__init__.py" in fenced


def test_a_three_line_goal_shows_as_three_lines():
    assert render_markdown("one\ntwo\nthree") == "<p>one<br>\ntwo<br>\nthree</p>"


@pytest.mark.parametrize("text", ["__<script>alert(1)</script>__", "- #<img src=x onerror=alert(1)>",
                                  "`x` __<b onclick=alert(1)>y</b>__", "[a](javascript:alert(1)) #1"])
def test_the_new_escapes_keep_nh3_sanitizing(text):
    html = render_markdown(text)
    assert "<script" not in html and "onerror" not in html and "onclick" not in html and "javascript:" not in html


def test_the_chat_panel_shows_a_goal_on_its_lines(world):
    bus.send(world.space, bus.OPERATOR, "boss", "Goal:\nread the repo\nreport back")
    html = world.client(world.viewer).get("/spaces/alpha/panels/messages/").content.decode()
    assert "Goal:<br>\nread the repo<br>\nreport back" in html


# --- phase ages --------------------------------------------------------------------------------------------------

LONG_AGO = datetime(2020, 1, 1, tzinfo=tz.utc)


@pytest.mark.parametrize("verb", ["suspend", "freeze", "halt_all"])
def test_freeze_suspend_and_halt_restart_the_phase_age(world, verb):
    w1 = supervisor.get_member(world.space, "w1")
    Member.objects.filter(pk=w1.pk).update(phase_since=LONG_AGO)
    if verb == "halt_all":
        supervisor.halt_all(world.space, actor="test")
    else:
        getattr(supervisor, verb)(w1, actor="test")
    assert Member.objects.get(pk=w1.pk).phase_since > LONG_AGO
    Member.objects.filter(pk=w1.pk).update(phase_since=LONG_AGO)
    supervisor.resume_all(world.space, actor="test") if verb != "freeze" else supervisor.unfreeze(w1, actor="test")
    assert Member.objects.get(pk=w1.pk).phase_since > LONG_AGO, "and so does coming back"


# --- a reason to reject a learned rule ----------------------------------------------------------------------------

def test_disabling_a_learned_rule_asks_why_and_keeps_the_reason(world):
    Member.objects.filter(space=world.space, name="w1").update(rule_domains=["ops"])
    owner = f"space:{world.space.pk}"
    learning.run_reflect(source=StaticSource(correction_items=[Correction(
        key="c1", domains=["ops"], text="approval denied: rm -rf; reason: never delete build outputs", owner=owner)]))
    learning.run_learn(domain="ops", auto_approve=True)
    rule = Rule.objects.get(source="learned")
    op, url = world.client(world.operator), reverse("console:rules", args=["alpha"])
    assert 'placeholder="why reject it?"' in op.get(url).content.decode()
    refused = op.post(url, {"action": "toggle_learned", "rule_id": rule.pk})
    assert refused.status_code == 400 and "reason" in refused.content.decode()
    assert Rule.objects.get(pk=rule.pk).enabled
    op.post(url, {"action": "toggle_learned", "rule_id": rule.pk, "reason": "too broad for builds"})
    assert not Rule.objects.get(pk=rule.pk).enabled
    assert RuleChange.objects.filter(action="disable").get().summary == f"disabled L{rule.pk}: too broad for builds"
    op.post(url, {"action": "toggle_learned", "rule_id": rule.pk})  # enabling again needs no reason
    assert Rule.objects.get(pk=rule.pk).enabled


# --- numbers, favicon, names --------------------------------------------------------------------------------------

def test_token_counts_have_thousands_separators(world):
    w1 = supervisor.get_member(world.space, "w1")
    Member.objects.filter(pk=w1.pk).update(budget_override=2000000)
    budget.meter(w1, input_tokens=1234567, output_tokens=0)
    client = world.client(world.viewer)
    assert "1,234,567" in client.get("/spaces/alpha/panels/roster/").content.decode()
    header = client.get("/spaces/alpha/members/w1/panels/header/").content.decode()
    assert "1,234,567" in header and "2,000,000" in header
    assert "1,234,567" in client.get("/spaces/alpha/usage/").content.decode()


def test_the_favicon_is_served_and_linked(world):
    client = world.client(world.viewer)
    assert 'rel="icon"' in client.get("/spaces/alpha/").content.decode()
    assert client.get("/static/favicon.svg").status_code == 200
    assert client.get("/favicon.ico").headers["Location"] == "/static/favicon.svg"


def test_webhook_deliveries_is_spelled_right():
    assert WebhookDelivery._meta.verbose_name_plural == "webhook deliveries"
