"""The review gate: approve (as a whole, one transaction), edit, reject, staleness, the 25-rule gate,
and readers never seeing half a rule set."""
import threading
import time

import pytest
from django.db import connection, transaction

from learning import api, people, store
from learning.models import Proposal, Rule, RuleChange, RuleSource, StoreState, people_write
from learning.ops import snapshot_diff

pytestmark = pytest.mark.django_db


def propose(domain, ops):
    base = store.learned_snapshot(domain)
    from learning.ops import apply_ops, normalize_ops

    ops = normalize_ops(ops)
    return Proposal.objects.create(domain=store.as_domain(domain), ops=ops, base=base, diff=snapshot_diff(base, apply_ops(base, ops, max_active=25)))


def learned(domain="ops"):
    return [(r.text, r.strength, r.enabled) for r in Rule.objects.filter(domain__name=domain, source=RuleSource.LEARNED).order_by("id")]


def test_approve_applies_all_ops_and_records_history():
    store.apply_ops("ops", [{"op": "add", "text": "A."}, {"op": "add", "text": "B."}], actor="t")
    a, b = Rule.objects.order_by("id")
    p = propose("ops", [{"op": "add", "text": "C."}, {"op": "agree", "rule": a.pk}, {"op": "remove", "rule": b.pk}])
    change = api.approve_proposal(p.pk, actor="reviewer")
    p.refresh_from_db()
    assert p.status == "approved" and p.decided_by == "reviewer" and p.decided_at
    assert learned() == [("A.", 2, True), ("B.", 0, False), ("C.", 1, True)]
    assert change.proposal_id == p.pk and change.actor == "reviewer" and change.action == "apply"
    assert sorted(line["sign"] for line in change.diff) == ["+", "-", "^"]
    with pytest.raises(api.ReviewError):
        api.approve_proposal(p.pk, actor="reviewer")
    with pytest.raises(api.ReviewError):
        api.reject_proposal(p.pk, actor="reviewer")


def test_failure_mid_apply_rolls_back_entirely(monkeypatch):
    store.apply_ops("ops", [{"op": "add", "text": "A."}, {"op": "add", "text": "B."}], actor="t")
    a, b = Rule.objects.order_by("id")
    p = propose("ops", [{"op": "edit", "rule": a.pk, "text": "A2."}, {"op": "agree", "rule": b.pk},
                        {"op": "add", "text": "C."}, {"op": "add", "text": "D."}])
    before, stamp, history = learned(), StoreState.objects.get().stamp, RuleChange.objects.count()
    block = api.prompt_block(["ops"])

    real_create = Rule.objects.create
    calls = {"n": 0}

    def torn_create(**kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # the second new row: the edit, the agree and one add are already written
            raise RuntimeError("disk went away mid-apply")
        return real_create(**kwargs)

    monkeypatch.setattr(Rule.objects, "create", torn_create)
    with pytest.raises(RuntimeError):
        api.approve_proposal(p.pk, actor="reviewer")
    monkeypatch.undo()

    assert learned() == before
    assert StoreState.objects.get().stamp == stamp
    assert RuleChange.objects.count() == history
    assert Proposal.objects.get(pk=p.pk).status == "pending"
    assert api.prompt_block(["ops"]) == block
    api.approve_proposal(p.pk, actor="reviewer")  # and it still applies cleanly afterwards
    assert learned() == [("A2.", 1, True), ("B.", 2, True), ("C.", 1, True), ("D.", 1, True)]


def test_edited_ops_and_invalid_edits():
    p = propose("ops", [{"op": "add", "text": "Original."}])
    with pytest.raises(api.ReviewError):
        api.approve_proposal(p.pk, actor="r", edited_ops=[{"op": "explode"}])
    with pytest.raises(api.ReviewError):
        api.approve_proposal(p.pk, actor="r", edited_ops=[{"op": "agree", "rule": 424242}])
    assert Proposal.objects.get(pk=p.pk).status == "pending" and learned() == []
    api.approve_proposal(p.pk, actor="r", edited_ops=[{"op": "add", "text": "Edited by a person."}])
    p.refresh_from_db()
    assert p.ops == [{"op": "add", "text": "Edited by a person."}]
    assert p.original_ops == [{"op": "add", "text": "Original."}]
    assert learned() == [("Edited by a person.", 1, True)]


def test_reject():
    p = propose("ops", [{"op": "add", "text": "Nope."}])
    api.reject_proposal(p.pk, actor="r", reason="too vague")
    p.refresh_from_db()
    assert (p.status, p.reason, p.decided_by) == ("rejected", "too vague", "r")
    assert learned() == []
    with pytest.raises(api.ReviewError):
        api.approve_proposal(p.pk, actor="r")
    with pytest.raises(api.ReviewError):
        api.reject_proposal(999999, actor="r")


def test_stale_proposal_is_refused_and_preview_shows_it():
    store.apply_ops("ops", [{"op": "add", "text": "A."}], actor="t")
    a = Rule.objects.get()
    p = propose("ops", [{"op": "remove", "rule": a.pk}])
    q = propose("ops", [{"op": "agree", "rule": a.pk}])
    api.approve_proposal(p.pk, actor="r")  # A retires
    view = people.preview(q)
    assert view["stale"] and "retired" in view["error"]
    with pytest.raises(api.ReviewError):
        api.approve_proposal(q.pk, actor="r")
    assert Proposal.objects.get(pk=q.pk).status == "pending"


def test_gate_at_approval_time():
    store.apply_ops("ops", [{"op": "add", "text": f"Rule {i}."} for i in range(12)], actor="t")
    store.apply_ops("ops", [{"op": "add", "text": f"Rule b{i}."} for i in range(12)], actor="t")
    p = propose("ops", [{"op": "add", "text": "Twenty-five."}])
    q = propose("ops", [{"op": "add", "text": "Twenty-six."}])  # each alone fits; together they do not
    api.approve_proposal(p.pk, actor="r")
    with pytest.raises(api.ReviewError) as exc:
        api.approve_proposal(q.pk, actor="r")
    assert "limit 25" in str(exc.value)
    assert Rule.objects.filter(source="learned", enabled=True).count() == 25


@pytest.mark.django_db(transaction=True)
def test_readers_see_old_or_new_rule_set_never_half():
    store.apply_ops("ops", [{"op": "add", "text": f"Base rule {i}."} for i in range(10)], actor="t")
    api.add_user_rule("ops", "User rule.", actor="a")
    ids = list(Rule.objects.filter(source="learned").order_by("id").values_list("id", flat=True))
    proposals = [propose("ops", [{"op": "edit", "rule": rid, "text": f"Edited rule {i}."} for i, rid in enumerate(ids)])]
    valid = {api.prompt_block(["ops"])}
    store.clear_cache()
    stop = threading.Event()
    seen, errors = [], []

    def reader():
        try:
            while not stop.is_set():
                store.clear_cache()  # force a real read of the rules every time
                seen.append(api.prompt_block(["ops"]))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    def reads(n: int) -> None:  # on a loaded host the readers may start late: wait for them, not a clock
        deadline = time.monotonic() + 30
        while len(seen) < n and not errors and time.monotonic() < deadline:
            time.sleep(0.005)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        reads(3)  # readers see the old set before the first approval...
        for p in proposals:
            api.approve_proposal(p.pk, actor="r")
            valid.add(api.prompt_block(["ops"]))
        # and a second, differently shaped change: retire half the rules
        q = propose("ops", [{"op": "remove", "rule": rid} for rid in ids[:5]])
        api.approve_proposal(q.pk, actor="r")
        store.clear_cache()
        valid.add(api.prompt_block(["ops"]))
        reads(len(seen) + 3)  # ...and the new one after the last
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors
    assert len(seen) > 5 and set(seen) <= valid, set(seen) - valid
    assert len(valid) == 3


@pytest.mark.django_db(transaction=True)
def test_reading_never_waits_on_a_writer_or_a_pass():
    api.add_user_rule("ops", "Before.", actor="a")
    old = api.prompt_block(["ops"])
    store.clear_cache()
    holder = api.WriterLock(ttl=30)
    holder.acquire(wait=0)  # a pass is running
    inside, release = threading.Event(), threading.Event()

    def slow_writer():
        try:
            with people_write(), transaction.atomic():  # an open rule write (holds SQLite's write lock)
                store.bump_stamp()
                Rule.objects.filter(source=RuleSource.USER).update(text="After.")
                inside.set()
                release.wait(10)
        finally:
            connection.close()

    t = threading.Thread(target=slow_writer)
    t.start()
    try:
        assert inside.wait(10)
        started = time.monotonic()
        assert api.prompt_block(["ops"]) == old  # the committed rule set, at once
        assert time.monotonic() - started < 0.5
    finally:
        release.set()
        t.join(15)
        holder.release()
    assert "After." in api.prompt_block(["ops"])
