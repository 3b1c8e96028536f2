from veronica.swarm import bus
from veronica.engine import runner, supervisor
from veronica.models import Session, Turn


def _converse(space, scripted, n=5):
    scripted(*[("list_dir", {})] * n, "done")
    bus.send(space, "boss", "w1", "explore")
    runner.wake(supervisor.get_member(space, "w1").pk, "message")


def test_micro_compaction_elides_older_tool_output_without_a_model_call(space, scripted):
    _converse(space, scripted)
    result = supervisor.compact(supervisor.get_member(space, "w1"), "micro", actor="op")
    assert result["elided"] >= 2
    elided = Turn.objects.filter(role="tool", elided=True)
    assert elided.count() == result["elided"]
    assert not Turn.objects.filter(role="tool").order_by("-seq").first().elided  # recent output kept


def test_full_compaction_replaces_the_transcript_with_a_summary(space, scripted):
    _converse(space, scripted)
    w1 = supervisor.get_member(space, "w1")
    supervisor.compact(w1, "full", actor="op")
    open_session = Session.objects.get(member=w1, ended_at__isnull=True)
    turns = list(open_session.turns.values_list("role", "content"))
    assert turns[0][0] == "user" and turns[0][1].startswith("Summary of the earlier conversation")
    assert Session.objects.filter(member=w1, end_reason="compacted").count() == 1
    assert w1.phase == "ready"


def test_clear_session_wipes_the_conversation_but_keeps_the_seat(space, scripted):
    _converse(space, scripted)
    w1 = supervisor.set_schedule(supervisor.get_member(space, "w1"), "0 * * * *", actor="op")
    supervisor.clear_session(w1, actor="op")
    assert not Session.objects.filter(member=w1, ended_at__isnull=True).exists()
    w1.refresh_from_db()
    assert w1.schedule == "0 * * * *" and w1.membership == "active"
    assert Turn.objects.filter(session__member=w1).exists()  # history kept, just closed
