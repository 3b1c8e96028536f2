"""A budget trip is told to the leader (the seed's notifyOps) as well as the operator."""
from veronica.swarm import bus
from veronica.engine.drive import run_until_quiet
from veronica.models import Member, Message


def test_a_workers_trip_mails_the_leader_and_the_operator(space):
    Member.objects.filter(space=space, name__in=["w1", "w2"]).update(budget_override=1)
    bus.send(space, bus.OPERATOR, "boss", "Find TODO notes in src/")  # the leader assigns it; w1 works with tools
    run_until_quiet(space, timeout=60)
    notices = Message.objects.filter(space=space, subject="Budget tripped: w1")
    assert sorted(notices.values_list("recipient_name", flat=True)) == ["boss", "operator"]
    assert all(m.sender_name == bus.SYSTEM and "daily budget is 1" in m.body for m in notices)


def test_a_leaders_own_trip_goes_to_the_operator_only(space):
    Member.objects.filter(space=space, name="boss").update(budget_override=1)
    bus.send(space, bus.OPERATOR, "boss", "Find TODO notes in src/")
    run_until_quiet(space, timeout=60)
    notices = Message.objects.filter(space=space, subject="Budget tripped: boss")
    assert list(notices.values_list("recipient_name", flat=True)) == ["operator"]
