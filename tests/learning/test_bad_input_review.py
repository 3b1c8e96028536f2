"""The admin's rule-review decide view: bad input is an error message, never a 500."""
import json

import pytest
from django.urls import reverse

from learning import api
from learning.models import Proposal

pytestmark = pytest.mark.django_db


@pytest.fixture
def pending(source):
    api.run_reflect(source)
    api.run_learn()
    return Proposal.objects.get(domain__name="ops")


@pytest.mark.parametrize("data", [
    {"action": "reject", "reason": "no\x00"},
    {"action": "approve", "ops": json.dumps([{"op": "add", "text": "Never\u0000 push."}])},
    {"action": "approve", "ops": "[" * 100_000},
], ids=["reject reason NUL", "edited op text NUL", "edited ops too deep"])
def test_a_bad_decision_leaves_the_proposal_pending(admin_client, pending, data):
    response = admin_client.post(reverse("admin:learning_proposal_decide", args=[pending.pk]), data)
    assert response.status_code < 500, response.status_code
    assert Proposal.objects.get(pk=pending.pk).status == "pending"
