"""Console pages for rules and waggles: access, sanitizing, and that writes go through the apps."""
import pytest
from django.urls import reverse

from learning import api as learning
from learning.models import Proposal, Rule
from veronica.models import AccessRole, Member, SpaceAccess


@pytest.fixture
def routed(space):
    Member.objects.filter(space=space, name="w1").update(rule_domains=["ops"])
    return space


def login_as(client, django_user_model, space, role, name="u"):
    user = django_user_model.objects.create_user(name, password="pw")
    SpaceAccess.objects.create(user=user, space=space, role=role)
    client.force_login(user)
    return user


@pytest.mark.parametrize("page", ["console:rules", "console:waggles"])
def test_a_user_without_access_gets_404(client, django_user_model, routed, page, tmp_path):
    from tests.conftest import make_space

    other = make_space(tmp_path, "other")
    login_as(client, django_user_model, other, AccessRole.OWNER)
    assert client.get(reverse(page, args=[routed.slug])).status_code == 404
    assert client.post(reverse(page, args=[routed.slug]), {"action": "add_rule"}).status_code == 404


def test_owner_adds_a_user_rule_and_it_renders_inert(client, django_user_model, routed):
    login_as(client, django_user_model, routed, AccessRole.OWNER)
    client.post(reverse("console:rules", args=[routed.slug]), {"action": "add_rule", "domain": "ops", "text": "<script>x()</script> be careful"})
    assert Rule.objects.get(domain__name="ops", source="user").text.endswith("be careful")
    html = client.get(reverse("console:rules", args=[routed.slug])).content.decode()
    assert "<script>x()</script>" not in html and "&lt;script&gt;" in html


def test_viewer_and_operator_cannot_write_user_rules(client, django_user_model, routed):
    login_as(client, django_user_model, routed, AccessRole.OPERATOR)
    client.post(reverse("console:rules", args=[routed.slug]), {"action": "add_rule", "domain": "ops", "text": "nope"})
    assert not Rule.objects.filter(domain__name="ops").exists()


def test_a_domain_not_routed_here_is_refused(client, django_user_model, routed):
    login_as(client, django_user_model, routed, AccessRole.OWNER)
    client.post(reverse("console:rules", args=[routed.slug]), {"action": "add_rule", "domain": "elsewhere", "text": "x"})
    assert not Rule.objects.filter(domain__name="elsewhere").exists()


def test_operator_approves_a_proposal_from_the_console(client, django_user_model, routed):
    from learning.sources import Correction, StaticSource

    learning.run_reflect(source=StaticSource(correction_items=[Correction(
        key="c1", domains=["ops"], text="approval denied: run_command rm -rf; reason: never delete build outputs",
        owner=f"space:{routed.pk}")]))
    learning.run_learn(domain="ops")
    proposal = Proposal.objects.get(status="pending")
    login_as(client, django_user_model, routed, AccessRole.OPERATOR)
    html = client.get(reverse("console:rules", args=[routed.slug])).content.decode()
    assert f"proposal-{proposal.pk}" in html
    client.post(reverse("console:rules", args=[routed.slug]), {"action": "approve", "proposal_id": proposal.pk})
    assert Proposal.objects.get(pk=proposal.pk).status == "approved"
    assert "never delete" in learning.prompt_block(["ops"], owner=f"space:{routed.pk}")


def test_waggle_library_lists_and_toggles(client, django_user_model, routed):
    from waggle.models import Waggle

    Waggle.objects.create(name="ls-read", space_key=str(routed.pk), route={"steps": []}, script="list_dir then read_file")
    viewer = login_as(client, django_user_model, routed, AccessRole.VIEWER, "viewer")
    html = client.get(reverse("console:waggles", args=[routed.slug])).content.decode()
    assert "estimate" in html
    client.post(reverse("console:waggles", args=[routed.slug]), {"name": "ls-read", "scope": "space", "action": "disable"})
    assert not Waggle.objects.get(name="ls-read").disabled, "a viewer cannot disable"
    client.logout()
    login_as(client, django_user_model, routed, AccessRole.OPERATOR, "op")
    client.post(reverse("console:waggles", args=[routed.slug]), {"name": "ls-read", "scope": "space", "action": "disable"})
    assert Waggle.objects.get(name="ls-read").disabled
    assert viewer


def test_operator_accepts_mail_with_an_edit_and_learning_mines_it(client, django_user_model, routed):
    from veronica.swarm import bus
    from veronica.swarm.learning_bridge import VeronicaSource
    from veronica.models import Message

    bus.send(routed, "w1", "operator", "Report: <script>alert(1)</script> all good")
    msg = Message.objects.get(recipient_name="operator")
    login_as(client, django_user_model, routed, AccessRole.VIEWER, "viewer")
    html = client.get(reverse("console:inbox", args=[routed.slug])).content.decode()
    assert "<script>alert(1)</script>" not in html and "all good" in html
    client.post(reverse("console:inbox", args=[routed.slug]), {"message_id": msg.pk, "body": "edited"})
    assert Message.objects.get(pk=msg.pk).accepted_at is None, "viewers cannot accept"
    client.logout()
    login_as(client, django_user_model, routed, AccessRole.OPERATOR, "op")
    client.post(reverse("console:inbox", args=[routed.slug]), {"message_id": msg.pk, "body": "Report: all good, 3 files checked"})
    msg.refresh_from_db()
    assert msg.accepted_body == "Report: all good, 3 files checked" and msg.body.startswith("Report: <script>")
    items = list(VeronicaSource().outbox_items())
    assert [(i.key, i.domains, i.edited) for i in items] == [(f"outbox:{msg.pk}", ["ops"], "Report: all good, 3 files checked")]


def test_accepting_unedited_mail_is_not_a_lesson(client, django_user_model, routed):
    from veronica.swarm import bus
    from veronica.swarm.learning_bridge import VeronicaSource
    from veronica.models import Message

    bus.send(routed, "w1", "operator", "fine as is")
    login_as(client, django_user_model, routed, AccessRole.OPERATOR, "op")
    msg = Message.objects.get(recipient_name="operator")
    client.post(reverse("console:inbox", args=[routed.slug]), {"message_id": msg.pk, "body": "fine as is"})
    assert Message.objects.get(pk=msg.pk).accepted_at is not None
    assert list(VeronicaSource().outbox_items()) == []
