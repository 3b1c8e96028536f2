"""Admin pages: rules (user rules via the people API), the rule-review screen, history and revert."""
import json

import pytest
from django.urls import reverse

from learning import api, store
from learning.models import Domain, Proposal, Rule, RuleChange, RuleSource
from learning.sources import Correction, StaticSource

pytestmark = pytest.mark.django_db


@pytest.fixture
def pending(source):
    api.run_reflect(source)
    api.run_learn()
    return Proposal.objects.get(domain__name="ops")


def test_every_learning_admin_page_opens(admin_client, pending):
    api.add_user_rule("ops", "User rule.", actor="a")
    store.apply_ops("ops", [{"op": "add", "text": "Learned."}], actor="t")
    learned = Rule.objects.get(source="learned")
    change = RuleChange.objects.first()
    urls = [
        reverse("admin:app_list", args=["learning"]),
        reverse("admin:learning_rule_changelist"),
        reverse("admin:learning_rule_add"),
        reverse("admin:learning_rule_change", args=[Rule.objects.get(source="user").pk]),
        reverse("admin:learning_rule_change", args=[learned.pk]),
        reverse("admin:learning_proposal_changelist"),
        reverse("admin:learning_proposal_review"),
        reverse("admin:learning_proposal_change", args=[pending.pk]),
        reverse("admin:learning_rulechange_changelist"),
        reverse("admin:learning_rulechange_change", args=[change.pk]),
        reverse("admin:learning_reflection_changelist"),
        reverse("admin:learning_mineditem_changelist"),
        reverse("admin:learning_passrun_changelist"),
        reverse("admin:learning_writerlease_changelist"),
    ]
    for url in urls:
        response = admin_client.get(url)
        assert response.status_code == 200, url
    assert admin_client.get(reverse("admin:learning_proposal_change", args=["nope"])).status_code == 404


def test_review_screen_lists_pending_with_diff(admin_client, pending):
    page = admin_client.get(reverse("admin:learning_proposal_review")).content.decode()
    assert f"Proposal #{pending.pk}" in page
    assert "Do not run rm -rf (reason: it deletes the workspace)." in page  # the diff line
    assert 'class="diff-+"' in page
    assert 'name="action" value="approve"' in page and 'name="action" value="reject"' in page
    assert "Rule review" in admin_client.get(reverse("admin:learning_proposal_changelist")).content.decode()


def test_approve_through_the_review_screen(admin_client, admin_user, pending):
    url = reverse("admin:learning_proposal_decide", args=[pending.pk])
    assert admin_client.get(url).status_code == 405
    response = admin_client.post(url, {"action": "approve", "next": reverse("admin:learning_proposal_review")})
    assert response.status_code == 302
    pending.refresh_from_db()
    assert pending.status == "approved" and pending.decided_by == admin_user.username
    assert "Do not run rm -rf" in api.prompt_block(["ops"])
    page = admin_client.get(reverse("admin:learning_proposal_review")).content.decode()
    assert f'id="proposal-{pending.pk}"' not in page  # no longer pending
    again = admin_client.post(url, {"action": "approve"}, follow=True)
    assert "already approved" in again.content.decode()


def test_edit_then_approve_and_bad_edit(admin_client, pending):
    url = reverse("admin:learning_proposal_decide", args=[pending.pk])
    bad = admin_client.post(url, {"action": "approve", "ops": "{not json"}, follow=True)
    assert "not valid JSON" in bad.content.decode()
    assert Proposal.objects.get(pk=pending.pk).status == "pending"
    ops = [{"op": "add", "text": "Never run rm -rf outside the workdir."}]
    admin_client.post(url, {"action": "approve", "ops": json.dumps(ops)})
    block = api.prompt_block(["ops"])
    assert "Never run rm -rf outside the workdir." in block and "Never push to main" not in block


def test_reject_through_the_review_screen(admin_client, pending):
    url = reverse("admin:learning_proposal_decide", args=[pending.pk])
    admin_client.post(url, {"action": "reject", "reason": "not general enough"})
    pending.refresh_from_db()
    assert pending.status == "rejected" and pending.reason == "not general enough"
    assert api.prompt_block(["ops"]) is None


def test_user_rule_add_edit_delete_in_admin_go_through_the_api(admin_client, admin_user):
    ops, writing = (store.domain_for(n, "space:1") for n in ("ops", "writing"))
    response = admin_client.post(reverse("admin:learning_rule_add"), {"domain": ops.pk, "text": "Ask before deleting."})
    assert response.status_code == 302, response.content.decode()[:2000]
    rule = Rule.objects.get()
    assert (rule.source, rule.domain, rule.created_by) == (RuleSource.USER, ops, admin_user.username)
    admin_client.post(reverse("admin:learning_rule_change", args=[rule.pk]), {"domain": writing.pk, "text": "Always ask before deleting."})
    assert (Rule.objects.get().text, Rule.objects.get().domain) == ("Always ask before deleting.", writing)
    bad = admin_client.post(reverse("admin:learning_rule_add"), {"domain": ops.pk, "text": " "})
    assert bad.status_code == 200 and not Rule.objects.filter(domain=ops).exists()
    admin_client.post(reverse("admin:learning_rule_delete", args=[rule.pk]), {"post": "yes"})
    assert not Rule.objects.exists()
    assert [(c.action, c.actor) for c in RuleChange.objects.order_by("id")] == [
        ("add", admin_user.username), ("edit", admin_user.username), ("remove", admin_user.username)]


def test_staff_create_global_domains_in_the_admin(admin_client, admin_user):
    response = admin_client.post(reverse("admin:learning_domain_add"), {"name": "House-Style", "is_global": "on", "owner": ""})
    assert response.status_code == 302, response.content.decode()[:2000]
    made = Domain.objects.get()
    assert (made.name, made.is_global, made.owner, made.created_by, made.ref) == (
        "house-style", True, "", admin_user.username, "global:house-style")
    bad = admin_client.post(reverse("admin:learning_domain_add"), {"name": "not a domain!", "owner": "space:1"})
    assert bad.status_code == 200 and "is not a domain name" in bad.content.decode()
    owned_global = admin_client.post(reverse("admin:learning_domain_add"), {"name": "x", "is_global": "on", "owner": "space:1"})
    assert owned_global.status_code == 200 and "a global domain has no owner" in owned_global.content.decode()
    assert Domain.objects.count() == 1
    listing = admin_client.get(reverse("admin:learning_domain_changelist")).content.decode()
    assert "global (shared, staff-managed)" in listing


def test_learned_rule_admin_only_toggles(admin_client):
    store.apply_ops("ops", [{"op": "add", "text": "Learned."}], actor="t")
    rule = Rule.objects.get()
    url = reverse("admin:learning_rule_change", args=[rule.pk])
    admin_client.post(url, {"enabled": ""})  # unchecked
    rule.refresh_from_db()
    assert not rule.enabled and rule.text == "Learned."
    assert RuleChange.objects.latest("id").action == "disable"
    assert admin_client.get(reverse("admin:learning_rule_delete", args=[rule.pk])).status_code == 403


def test_history_detail_shows_diff_and_reverts(admin_client):
    rule = api.add_user_rule("ops", "Before.", actor="a")
    api.edit_user_rule(rule.pk, "After.", actor="b")
    edit = RuleChange.objects.latest("id")
    page = admin_client.get(reverse("admin:learning_rulechange_change", args=[edit.pk])).content.decode()
    assert "Before." in page and "After." in page and "Revert this change" in page
    response = admin_client.post(reverse("admin:learning_rulechange_revert", args=[edit.pk]))
    assert response.status_code == 302
    assert Rule.objects.get().text == "Before."
    page = admin_client.get(reverse("admin:learning_rulechange_change", args=[edit.pk])).content.decode()
    assert "Reverted by" in page
    again = admin_client.post(reverse("admin:learning_rulechange_revert", args=[edit.pk]), follow=True)
    assert "already reverted" in again.content.decode()


def test_review_needs_staff(client, pending):
    assert client.get(reverse("admin:learning_proposal_review")).status_code == 302  # to login
    client.post(reverse("admin:learning_proposal_decide", args=[pending.pk]), {"action": "approve"})
    assert Proposal.objects.get(pk=pending.pk).status == "pending"


def test_auto_approved_proposal_is_viewable(admin_client):
    api.run_reflect(StaticSource(correction_items=[Correction("c", ["ops"], "never do X")]))
    api.run_learn(auto_approve=True)
    p = Proposal.objects.get()
    page = admin_client.get(reverse("admin:learning_proposal_change", args=[p.pk])).content.decode()
    assert "auto-approved" in page and "History entry" in page


def test_decide_never_redirects_off_site(admin_client, pending):
    url = reverse("admin:learning_proposal_decide", args=[pending.pk])
    response = admin_client.post(url, {"action": "reject", "next": "//evil.example/phish"})
    assert response["Location"] == reverse("admin:learning_proposal_review")


def test_edit_box_shows_rule_refs(admin_client):
    store.apply_ops("ops", [{"op": "add", "text": "A."}], actor="t")
    rule = Rule.objects.get()
    p = Proposal.objects.create(domain=store.domain_for("ops"), ops=[{"op": "agree", "rule": rule.pk}], base=store.learned_snapshot("ops"))
    page = admin_client.get(reverse("admin:learning_proposal_change", args=[p.pk])).content.decode()
    assert f"&quot;L{rule.pk}&quot;" in page
    admin_client.post(reverse("admin:learning_proposal_decide", args=[p.pk]),
                      {"action": "approve", "ops": json.dumps([{"op": "agree", "rule": f"L{rule.pk}"}])})
    rule.refresh_from_db()
    assert rule.strength == 2


def test_review_and_change_screens_have_no_inline_styles(admin_client, pending):
    """The CSP allows styles from 'self' only: the diff colours and layout come from learning/admin.css."""
    from tests.console.test_web_hardening import inline_code

    store.apply_ops("ops", [{"op": "add", "text": "A."}], actor="t")
    change = RuleChange.objects.order_by("-pk").first()
    for url in (reverse("admin:learning_proposal_review"), reverse("admin:learning_proposal_change", args=[pending.pk]),
                reverse("admin:learning_rulechange_change", args=[change.pk])):
        page = admin_client.get(url).content.decode()
        assert inline_code(page) == [], url
        assert "learning/admin.css" in page, url


# NUL in a reason or an edited rule, ops nested past the parser's depth: an error message, never a 500
@pytest.mark.parametrize("data", [
    {"action": "reject", "reason": "no\x00"},
    {"action": "approve", "ops": json.dumps([{"op": "add", "text": "Never\u0000 push."}])},
    {"action": "approve", "ops": "[" * 100_000},
], ids=["reject reason NUL", "edited op text NUL", "edited ops too deep"])
def test_a_bad_decision_leaves_the_proposal_pending(admin_client, pending, data):
    response = admin_client.post(reverse("admin:learning_proposal_decide", args=[pending.pk]), data)
    assert response.status_code < 500, response.status_code
    assert Proposal.objects.get(pk=pending.pk).status == "pending"
