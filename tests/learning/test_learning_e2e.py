"""End to end on the learning side: a correction becomes a rule in the next run's prompt block."""
import pytest

from learning import api
from learning.models import Proposal
from learning.sources import Correction, StaticSource

pytestmark = pytest.mark.django_db


class FakeHost(StaticSource):
    """Stands in for the host: one denial with a reason, two members with their routed domains."""


def test_correction_to_prompt_block(settings):
    host = FakeHost(
        correction_items=[Correction(
            "approval:17", ["shell"],
            "approval denied: do not run rm -rf; reason: it deletes the workspace and the operator's files",
        )],
        routed={"shell", "writing"},
    )
    settings.LEARNING_SOURCE = lambda: host  # what the host wires by dotted path
    api.add_user_rule("shell", "Stay inside the workdir.", actor="operator")

    assert api.run_reflect().status == "ok"  # source and complete from settings (offline default)
    assert api.run_learn().status == "ok"
    proposal = Proposal.objects.get(status="pending")
    assert proposal.domain.name == "shell" and proposal.ops[0]["op"] == "add"
    assert api.prompt_block(["shell"]) == "## Rules\n\nOperator rules (set by people; always follow them, they override learned rules):\n- (shell) Stay inside the workdir."

    api.approve_proposal(proposal.pk, actor="operator")
    block = api.prompt_block(["shell"])
    assert block.index("Stay inside the workdir.") < block.index("Do not run rm -rf")
    assert "(reason: it deletes the workspace and the operator's files)" in block
    assert api.prompt_block(["writing"]) is None  # a member not routed to "shell" never sees it

    # a second correction of the same thing is a new lesson, and it strengthens the rule
    host.correction_items.append(Correction("approval:18", ["shell"], "approval denied: do not run rm -rf"))
    api.run_reflect()
    api.run_learn(auto_approve=True)
    assert Proposal.objects.latest("id").ops == [{"op": "agree", "rule": Proposal.objects.latest("id").ops[0]["rule"]}]


def test_one_correction_for_a_member_with_two_domains_is_one_proposal(settings):
    host = FakeHost(correction_items=[Correction("approval:21", ["shell", "writing"],
                                                 "approval denied: do not run rm -rf; reason: it deletes the workspace")],
                    routed={"shell", "writing"})
    settings.LEARNING_SOURCE = lambda: host
    assert api.run_reflect().status == "ok" and api.run_learn().status == "ok"
    assert [p.domain.name for p in Proposal.objects.filter(status="pending")] == ["shell"]
