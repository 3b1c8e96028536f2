import pytest

from veronica.swarm import bus
from veronica.engine import supervisor
from veronica.plumbing.errors import RecipientError, VeronicaError
from veronica.models import Event, Message


def test_send_persists_and_emits_before_anyone_is_woken(space, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        rows = bus.send(space, "boss", "w1", "hello")
        # the row and its event exist inside the transaction, before any on-commit wake ran
        assert Message.objects.filter(pk=rows[0].pk).exists()
        assert Event.objects.filter(space=space, kind="message.sent").count() == 1
    assert callbacks, "the wake is deferred to on_commit"


def test_all_reaches_every_active_member_but_the_sender_and_never_a_frozen_one(space):
    supervisor.add_member(space, "w3", actor="t")
    supervisor.freeze(supervisor.get_member(space, "w2"), actor="t")
    rows = bus.send(space, "w1", "all", "standup")
    assert sorted(r.recipient_name for r in rows) == ["boss", "w3"]


def test_role_target_resolves_to_the_unique_active_member(space):
    rows = bus.send(space, "w1", "leader", "done")
    assert [r.recipient_name for r in rows] == ["boss"]


def test_ambiguous_role_names_the_candidates(space):
    with pytest.raises(RecipientError) as err:
        bus.send(space, "boss", "worker", "who?")
    assert "ambiguous" in str(err.value) and "w1" in str(err.value) and "w2" in str(err.value)
    assert not Message.objects.exists()


def test_unknown_target_lists_candidates(space):
    with pytest.raises(RecipientError) as err:
        bus.send(space, "boss", "nobody", "x")
    assert "w1 (worker)" in str(err.value) and "boss (leader)" in str(err.value)


def test_frozen_member_still_gets_direct_mail_which_waits(space):
    w2 = supervisor.freeze(supervisor.get_member(space, "w2"), actor="t")
    rows = bus.send(space, "boss", "w2", "later")
    assert rows[0].recipient == w2 and rows[0].read_at is None


def test_operator_target_and_empty_body(space):
    assert bus.send(space, "boss", "operator", "report")[0].recipient is None
    with pytest.raises(VeronicaError) as err:
        bus.send(space, "boss", "w1", "   ")
    assert err.value.field == "body"
    with pytest.raises(VeronicaError, match="limit is 20000"):
        bus.send(space, "boss", "w1", "x" * 20001)


def test_mark_read_is_explicit_and_only_for_the_recipient(space):
    w1, w2 = supervisor.get_member(space, "w1"), supervisor.get_member(space, "w2")
    msg = bus.send(space, "boss", "w1", "hi")[0]
    assert bus.mark_read(w2, [msg.pk]) == 0
    assert bus.unread_for(w1).count() == 1
    assert bus.mark_read(w1, [msg.pk]) == 1
    assert bus.mark_read(w1, [msg.pk]) == 0
    assert Message.objects.filter(pk=msg.pk).exists()  # history kept
