"""The chat is two-way (issue 22.3): a run woken by operator mail records its final text as a reply."""
from __future__ import annotations

from veronica.swarm import bus, chat
from veronica.engine import runner, supervisor
from veronica.models import Event, Message
from tests.engine.test_fencing import take_over


def w1_of(space):
    return supervisor.get_member(space, "w1")


def test_the_final_text_of_a_run_woken_by_operator_mail_is_its_reply(space, scripted):
    scripted(("list_dir", {"path": "."}), "Here is what I found: nothing.")
    asked = bus.send(space, bus.OPERATOR, "w1", "what is in the workspace?", subject="survey")[0]
    assert runner.wake(w1_of(space).pk, "message") == "done"
    reply = Message.objects.get(sender_name="w1", recipient_name=bus.OPERATOR)
    assert (reply.body, reply.subject, reply.reply_to_id) == ("Here is what I found: nothing.", "Re: survey", asked.pk)
    sent = Event.objects.filter(kind="message.sent", payload__id=reply.pk).get()
    assert sent.payload["reply_to"] == asked.pk and sent.member.name == "w1"
    thread = chat.conversation(w1_of(space))["messages"]
    assert [(m["sender"], m["reply_to"]) for m in thread] == [("operator", None), ("w1", asked.pk)]


def test_mail_from_a_member_gets_no_reply_to_the_operator(space, scripted):
    scripted("done with it")
    bus.send(space, "boss", "w1", "a job")
    assert runner.wake(w1_of(space).pk, "message") == "done"
    assert not Message.objects.filter(recipient_name=bus.OPERATOR).exists()


def test_a_run_that_mailed_the_operator_itself_records_no_second_copy(space, scripted):
    scripted(("send_message", {"to": "operator", "body": "my answer"}), "sent it")
    bus.send(space, bus.OPERATOR, "w1", "a question")
    assert runner.wake(w1_of(space).pk, "message") == "done"
    assert list(Message.objects.filter(recipient_name=bus.OPERATOR).values_list("body", flat=True)) == ["my answer"]


def test_a_run_that_lost_its_lease_records_no_reply(space, scripted):
    w1 = w1_of(space)
    provider = scripted("a stale answer")
    bus.send(space, bus.OPERATOR, "w1", "a question")
    provider.on_call = lambda n: take_over(w1.pk)
    assert runner.wake(w1.pk, "message") == "lease-lost"
    assert not Message.objects.filter(recipient_name=bus.OPERATOR).exists()


def test_a_reply_after_a_failed_run_answers_the_operators_mail_of_the_folded_brief(space, scripted):
    from veronica.agent.providers.base import ProviderError

    scripted(ProviderError("vendor hiccup"), "the answer at last")
    asked = bus.send(space, bus.OPERATOR, "w1", "a question")[0]
    assert runner.wake(w1_of(space).pk, "message") == "error"
    supervisor.resume(w1_of(space), actor="test")  # un-parks the backoff: the retry runs now
    assert runner.wake(w1_of(space).pk, "resume") == "done"
    assert Message.objects.get(recipient_name=bus.OPERATOR).reply_to_id == asked.pk
