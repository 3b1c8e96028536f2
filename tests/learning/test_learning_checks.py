"""Start-up system checks."""
import pytest
from django.core import checks

from learning import api, store
from learning.checks import check_rule_domains
from learning.sources import StaticSource

pytestmark = pytest.mark.django_db

ROUTED = StaticSource(routed={"ops"})


def make_source():
    return ROUTED


def ids(messages):
    return sorted((m.id, m.obj) for m in messages)


def test_registered_with_django_checks():
    assert check_rule_domains in checks.registry.registry.get_checks()


def test_warns_on_unrouted_domain_with_rules(settings):
    settings.LEARNING_SOURCE = make_source  # a dotted path works the same (import_string)
    api.add_user_rule("ops", "Routed.", actor="a")
    api.add_user_rule("opz", "Typo domain.", actor="a")
    store.apply_ops("triage", [{"op": "add", "text": "Learned, unrouted."}], actor="t")
    store.apply_ops("retired", [{"op": "add", "text": "Disabled only."}], actor="t")
    api.set_learned_enabled(store.learned_snapshot("retired")[0]["id"], False, actor="a")
    found = check_rule_domains()
    assert ids(found) == [("learning.W001", "learning domain unowned/opz"), ("learning.W001", "learning domain unowned/triage")]
    assert all(isinstance(m, checks.Warning) for m in found)


def test_warns_on_domain_over_25_active_learned_rules(settings):
    settings.LEARNING_SOURCE = make_source
    store.apply_ops("ops", [{"op": "add", "text": f"Rule {i}."} for i in range(12)], actor="t")
    store.apply_ops("ops", [{"op": "add", "text": f"Rule b{i}."} for i in range(13)], actor="t")
    assert check_rule_domains() == []  # 25 is the limit, not over it
    # a domain past the limit (data from before every path checked it; here a caller raising the limit)
    store.apply_ops("ops", [{"op": "add", "text": "x"}], actor="t", max_active=100)
    [warning] = check_rule_domains()
    assert warning.id == "learning.W002" and "26 active learned rules" in warning.msg


def test_no_source_means_no_routed_domains(settings):
    settings.LEARNING_SOURCE = None
    api.add_user_rule("ops", "Nobody reads me.", actor="a")
    assert ids(check_rule_domains()) == [("learning.W001", "learning domain unowned/ops")]


def test_check_survives_a_broken_source(settings):
    class Broken(StaticSource):
        def routed_domains(self):
            raise RuntimeError("host tables missing")
    settings.LEARNING_SOURCE = Broken
    api.add_user_rule("ops", "R.", actor="a")
    assert check_rule_domains() == []
