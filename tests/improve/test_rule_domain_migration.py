"""The migration that gives rule domains to spaces (learning 0002-0004, veronica 0004), run for real:
migrate back to before it, write rules the old way (domains as shared strings), migrate forward."""
from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from learning import api as learning
from learning.models import ChangeAction, Domain, Proposal, Reflection, Rule, RuleChange
from tests.conftest import make_space
from veronica.agent.prompt import rules_block
from veronica.engine import supervisor
from veronica.models import Approval, Member, Session

# Back to learning 0001 unapplies what depends on it (veronica 0004_rule_domains_per_space) and
# nothing else; forward goes to every leaf, so other apps' later migrations are never left behind.
BEFORE = [("learning", "0001_initial")]
AFTER = None


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    targets = targets or executor.loader.graph.leaf_nodes()
    executor.migrate(targets)
    applied = MigrationExecutor(connection).loader.applied_migrations  # every app's models as the schema now is
    return executor.loader.project_state(list(applied)).apps


def _denial(apps, member, reason="no"):
    """Written through the historical model: the schema is the old one here (later migrations add columns)."""
    OApproval = apps.get_model("veronica", "Approval")
    return f"approval:{OApproval.objects.create(space_id=member.space_id, member_id=member.pk, tool_name='run_command', tool_args={}, status='denied', reason=reason).pk}"


class _LaterMemberColumns:
    """Member columns added by migrations that come after the rule-domain one (so are unapplied with
    it): added by hand while the test writes members through today's model on the old schema, and
    dropped again before the forward migration adds them for real."""

    def __init__(self, old) -> None:
        old_fields = old.get_model("veronica", "Member")._meta.concrete_fields
        have = {f.column for f in old_fields}
        self.fields = [f for f in Member._meta.concrete_fields if f.column not in have]
        # and the old columns later migrations drop (reload_pending): today's model never writes them,
        # so on PostgreSQL they need a default while it inserts (SQLite's rebuilt table has one)
        now = {f.column for f in Member._meta.concrete_fields}
        self.gone = [f for f in old_fields if f.column not in now and not f.null and f.has_default()]
        self.added = False

    def _defaults(self, on: bool) -> None:
        if connection.vendor != "postgresql":
            return
        with connection.cursor() as cursor:
            for field in self.gone:
                default = "DROP DEFAULT" if not on else f"SET DEFAULT {'true' if field.get_default() is True else 'false' if field.get_default() is False else repr(field.get_default())}"
                cursor.execute(f'ALTER TABLE veronica_member ALTER COLUMN "{field.column}" {default}')

    def add(self) -> None:
        # SQLite adds a NOT NULL column by rebuilding the table from today's model, which brings every
        # later column at once: add only what is still missing after each step
        for field in self.fields:
            with connection.cursor() as cursor:
                have = {c.name for c in connection.introspection.get_table_description(cursor, Member._meta.db_table)}
            if field.column not in have:
                with connection.schema_editor() as editor:
                    editor.add_field(Member, field)
        self._defaults(True)
        self.added = True

    def drop(self) -> None:
        if self.added:
            self._defaults(False)
            with connection.schema_editor() as editor:
                for field in self.fields:
                    editor.remove_field(Member, field)
            self.added = False


@pytest.mark.django_db(transaction=True)
def test_shared_domains_split_per_space_single_ones_move_unrouted_ones_stay_unowned(tmp_path):
    old = _migrate(BEFORE)
    later = _LaterMemberColumns(old)
    try:
        later.add()
        a, b, c = make_space(tmp_path, "alpha"), make_space(tmp_path, "beta"), make_space(tmp_path, "gamma")
        Member.objects.filter(space=a, name="w1").update(rule_domains=["conduct", "solo"])
        Member.objects.filter(space=a, name="w2").update(rule_domains=["conduct"])
        Member.objects.filter(space=b, name="w1").update(rule_domains=["conduct"])
        gone = supervisor.remove_member(Member.objects.get(space=c, name="w1"), actor="t")
        Member.objects.filter(pk=gone.pk).update(rule_domains=["conduct"])  # a removed member routes nothing
        a_w1, b_w1 = Member.objects.get(space=a, name="w1"), Member.objects.get(space=b, name="w1")
        a_session = Session.objects.create(member=a_w1, ended_at=timezone.now())
        b_session = Session.objects.create(member=b_w1, ended_at=timezone.now())

        ORule, OProposal, OReflection, OChange = (old.get_model("learning", m) for m in ("Rule", "Proposal", "Reflection", "RuleChange"))
        kind = ORule.objects.create(domain="conduct", source="user", text="Be kind.", created_by="alice", updated_by="alice")
        cite = ORule.objects.create(domain="conduct", source="learned", text="Cite sources.", strength=3)
        ORule.objects.create(domain="conduct", source="learned", text="Old lesson.", enabled=False, strength=0)
        ORule.objects.create(domain="solo", source="user", text="Solo rule.")
        ORule.objects.create(domain="orphan", source="user", text="Orphan rule.")
        OChange.objects.create(actor="alice", domain="conduct", source="user", action="add", after=[{"id": kind.pk, "text": "Be kind."}])
        shared_proposal = OProposal.objects.create(domain="conduct", ops=[{"op": "agree", "rule": cite.pk}],
                                                   base=[{"id": cite.pk, "text": "Cite sources.", "strength": 3, "enabled": True}])
        OReflection.objects.create(kind="session", item_key=f"session:{a_session.pk}", domain="conduct", text="from A, proposed",
                                   consumed_at=timezone.now(), proposal=shared_proposal)
        OReflection.objects.create(kind="correction", item_key=_denial(old, a_w1), domain="conduct", text="from A")
        OReflection.objects.create(kind="correction", item_key=_denial(old, b_w1), domain="conduct", text="from B")
        OReflection.objects.create(kind="correction", item_key="approval:99999", domain="conduct", text="origin unknown")
        solo_proposal = OProposal.objects.create(domain="solo", ops=[{"op": "add", "text": "More solo."}])
        OReflection.objects.create(kind="session", item_key=f"session:{b_session.pk}", domain="solo", text="B's stray lesson")
        OReflection.objects.create(kind="correction", item_key=_denial(old, a_w1), domain="solo", text="A's solo lesson")

        later.drop()
        _migrate(AFTER)
    finally:
        later.drop()
        _migrate(AFTER)  # never leave the test database half-migrated
    learning.clear_cache()

    key_a, key_b, key_c = (f"space:{s.pk}" for s in (a, b, c))
    # a shared domain: a copy per routing space, same rules; the original keeps history, no rules
    shared = Domain.objects.get(owner="", is_global=False, name="conduct")
    copy_a, copy_b = Domain.objects.get(owner=key_a, name="conduct"), Domain.objects.get(owner=key_b, name="conduct")
    assert not Domain.objects.filter(owner=key_c).exists()
    assert not shared.rules.exists() and "split into a copy per space" in shared.note
    for copy in (copy_a, copy_b):
        rows = sorted(copy.rules.values_list("source", "text", "strength", "enabled", "created_by"))
        assert rows == [("learned", "Cite sources.", 3, True, ""), ("learned", "Old lesson.", 0, False, ""),
                        ("user", "Be kind.", 1, True, "alice")]
        assert f"#{shared.pk}" in copy.note
        split = list(copy.changes.values_list("action", "source"))
        assert sorted(split) == [(ChangeAction.SPLIT, "learned"), (ChangeAction.SPLIT, "user")]
    assert sorted(shared.changes.values_list("action", flat=True)) == ["add", "split", "split"]
    with pytest.raises(learning.ReviewError):
        learning.revert_change(copy_a.changes.first().pk, actor="p")
    # a pending proposal on the shared domain is rejected; its reflections queue again, per origin
    shared_p = Proposal.objects.get(pk=shared_proposal.pk)
    assert shared_p.status == "rejected" and "split" in shared_p.reason
    assert set(Reflection.objects.filter(domain=copy_a, consumed_at__isnull=True).values_list("text", flat=True)) == {
        "from A, proposed", "from A"}
    assert set(Reflection.objects.filter(domain=copy_b).values_list("text", flat=True)) == {"from B"}
    assert set(Reflection.objects.filter(domain=shared).values_list("text", flat=True)) == {"origin unknown"}
    # routed by one space: moves whole (ids, proposals kept); a stray lesson from another space stays unowned
    solo = Domain.objects.get(owner=key_a, name="solo")
    assert list(solo.rules.values_list("text", flat=True)) == ["Solo rule."]
    assert Proposal.objects.get(pk=solo_proposal.pk).status == "pending" and Proposal.objects.get(pk=solo_proposal.pk).domain == solo
    assert set(solo.reflections.values_list("text", flat=True)) == {"A's solo lesson"}
    assert set(Reflection.objects.filter(domain__owner="", domain__name="solo").values_list("text", flat=True)) == {"B's stray lesson"}
    # routed by nobody: unowned, read by no prompt
    orphan = Domain.objects.get(name="orphan")
    assert (orphan.owner, orphan.is_global, list(orphan.rules.values_list("text", flat=True))) == ("", False, ["Orphan rule."])
    assert Rule.objects.count() == 2 * 3 + 2

    # every prompt carries what it carried before, and only its own space's rules
    block_a = rules_block(Member.objects.get(space=a, name="w1"))
    block_b = rules_block(Member.objects.get(space=b, name="w1"))
    assert "Be kind." in block_a and "Cite sources." in block_a and "Solo rule." in block_a and "Old lesson." not in block_a
    assert "Be kind." in block_b and "Cite sources." in block_b and "Solo rule." not in block_b
    assert "Orphan rule." not in block_a + block_b
    # the spaces now diverge: A's edit leaves B alone
    learning.edit_user_rule(copy_a.rules.get(source="user").pk, "Be kind to A.", actor="owner-a", scope=[copy_a])
    learning.clear_cache()
    assert "Be kind to A." in rules_block(Member.objects.get(space=a, name="w1"))
    assert "Be kind." in rules_block(Member.objects.get(space=b, name="w1"))
    assert RuleChange.objects.filter(domain=copy_b, action="edit").count() == 0


@pytest.mark.django_db(transaction=True)
def test_migration_on_an_empty_store_changes_nothing():
    _migrate(BEFORE)
    _migrate(AFTER)
    assert not Domain.objects.exists() and not Rule.objects.exists()
