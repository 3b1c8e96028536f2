"""A space served as A2A agents, through the Django test client: the card, the four methods, the
per-space credential and its role, and bad input answered with a JSON-RPC error that writes nothing."""
from __future__ import annotations

import asyncio
import json

import pytest
from django.test import Client

from tests.conftest import make_space
from veronica.swarm import a2a_settings, bus, ledger
from veronica.models import A2ATaskLink, Event, Message, Task

RPC = "/a2a/{slug}/"


@pytest.fixture
def served(space):
    a2a_settings.set_enabled(space, True, actor="test")
    _, key = a2a_settings.create_credential(space, "peer", "operator", actor="test")
    return space, key


def rpc(slug, body, key=None, member=None, raw=None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key else {}
    path = RPC.format(slug=slug) + (f"{member}/" if member else "")
    return Client().post(path, data=raw if raw is not None else json.dumps(body), content_type="application/json", **headers)


def send_body(text="Write the weekly report", task_id=None, method="message/send", request_id="r1"):
    message = {"role": "user", "messageId": "m1", "kind": "message", "parts": [{"kind": "text", "text": text}]}
    if task_id:
        message["taskId"] = task_id
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": {"message": message}}


def counts():
    return Task.objects.count(), Message.objects.count(), A2ATaskLink.objects.count()


def test_a2a_is_off_until_the_owner_turns_it_on_and_the_answer_hides_whether_the_space_exists(space):
    for path in ("/a2a/alpha/.well-known/agent-card.json", "/a2a/nope/.well-known/agent-card.json"):
        assert Client().get(path).status_code == 404
    assert rpc("alpha", send_body()).status_code == 404
    a2a_settings.set_enabled(space, True, actor="test")
    card = Client().get("/a2a/alpha/.well-known/agent-card.json").json()
    assert card["url"] == "http://testserver/a2a/alpha/" and card["capabilities"]["streaming"] is True
    assert card["name"] == "Alpha / boss" and card["skills"] and "bearer" in card["securitySchemes"]
    assert Client().get("/a2a/alpha/w1/.well-known/agent-card.json").status_code == 404  # not exposed
    a2a_settings.set_members(space, ["w1"], actor="test")
    assert Client().get("/a2a/alpha/w1/.well-known/agent-card.json").json()["url"] == "http://testserver/a2a/alpha/w1/"


def test_message_send_is_mail_from_the_caller_and_a_task_on_the_board_mapped_back_by_get(served):
    space, key = served
    answer = rpc("alpha", send_body(), key).json()
    result = answer["result"]
    assert answer["id"] == "r1" and result["kind"] == "task" and result["status"]["state"] == "working"
    link = A2ATaskLink.objects.get(a2a_id=result["id"])
    task = link.task
    assert task.assignee.name == "boss" and task.creator_name == "a2a:peer" and task.title == "Write the weekly report"
    mail = Message.objects.get(task=task)
    assert mail.sender_name == "a2a:peer" and mail.recipient_name == "boss"
    ledger.complete(task, actor="boss", result="The report is in report.md")
    got = rpc("alpha", {"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": result["id"]}}, key).json()["result"]
    assert got["status"]["state"] == "completed"
    assert got["artifacts"][0]["parts"][0]["text"] == "The report is in report.md"


def test_a_named_member_is_served_only_when_exposed_and_a_follow_up_continues_the_task(served):
    space, key = served
    assert rpc("alpha", send_body(), key, member="w1").status_code == 404
    a2a_settings.set_members(space, ["w1"], actor="test")
    result = rpc("alpha", send_body("Fix the build"), key, member="w1").json()["result"]
    link = A2ATaskLink.objects.get(a2a_id=result["id"])
    assert link.task.assignee.name == "w1"
    again = rpc("alpha", send_body("It is the linker", task_id=result["id"]), key, member="w1").json()["result"]
    assert again["id"] == result["id"] and Task.objects.count() == 1
    assert Message.objects.filter(task=link.task, body="It is the linker", sender_name="a2a:peer").exists()


def test_cancel_moves_the_board_task_and_a_second_cancel_is_a_protocol_error(served):
    space, key = served
    task_id = rpc("alpha", send_body(), key).json()["result"]["id"]
    cancel = {"jsonrpc": "2.0", "id": 3, "method": "tasks/cancel", "params": {"id": task_id}}
    assert rpc("alpha", cancel, key).json()["result"]["status"]["state"] == "canceled"
    assert A2ATaskLink.objects.get(a2a_id=task_id).task.status == "cancelled"
    assert rpc("alpha", cancel, key).json()["error"]["code"] == -32002  # TaskNotCancelableError


def test_the_credential_is_checked_per_space_with_its_role(served, tmp_path):
    space, key = served
    other = make_space(tmp_path, "beta")
    a2a_settings.set_enabled(other, True, actor="test")
    _, other_key = a2a_settings.create_credential(other, "peer", "operator", actor="test")
    before = counts()
    for bad in (None, "a2a_wrong", other_key, "vrn_an_api_token"):
        response = rpc("alpha", send_body(), bad)
        assert response.status_code == 401 and response.json()["error"]["code"] == -32600
        assert response["WWW-Authenticate"].startswith("Bearer")
    _, viewer_key = a2a_settings.create_credential(space, "reader", "viewer", actor="test")
    refused = rpc("alpha", send_body(), viewer_key)
    assert refused.status_code == 403 and "operator" in refused.json()["error"]["message"]
    assert counts() == before
    task_id = rpc("alpha", send_body(), key).json()["result"]["id"]
    get = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": task_id}}
    assert rpc("alpha", get, viewer_key).json()["result"]["id"] == task_id
    cred = a2a_settings.credential_for_key(space, key)
    a2a_settings.revoke_credential(space, cred.pk, actor="test")
    assert rpc("alpha", get, key).status_code == 401


@pytest.mark.parametrize("raw, code", [
    (b"{not json", -32700),
    (b"[1, 2]", -32600),
    (json.dumps({"jsonrpc": "1.0", "id": 1, "method": "message/send"}).encode(), -32600),
    (json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tasks/list", "params": {}}).encode(), -32601),
    (json.dumps({"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {"parts": []}}}).encode(), -32602),
    (json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": "no-such-task"}}).encode(), -32001),
    (json.dumps(send_body("x" * (bus.MAX_BODY + 1))).encode(), -32602),
    (json.dumps(send_body("nul \u0000 inside")).encode(), -32602),
    (json.dumps({"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {
        "role": "user", "messageId": "m", "parts": [{"kind": "file", "file": {"uri": "http://x/y"}}]}}}).encode(), -32602),
    (json.dumps(send_body(task_id="not-a-task")).encode(), -32001),
])
def test_bad_input_is_a_protocol_error_and_writes_nothing(served, raw, code):
    space, key = served
    before, events = counts(), Event.objects.count()
    answer = rpc("alpha", None, key, raw=raw).json()
    assert answer["jsonrpc"] == "2.0" and answer["error"]["code"] == code, answer
    assert counts() == before and Event.objects.count() == events


def test_a_huge_body_is_refused_before_parsing(served, settings):
    space, key = served
    settings.A2A_MAX_BYTES = 2048
    before = counts()
    response = rpc("alpha", send_body("y" * 4000), key)
    assert response.status_code == 413 and response.json()["error"]["code"] == -32600
    assert counts() == before


def test_another_spaces_task_id_is_unknown(served, tmp_path):
    space, key = served
    other = make_space(tmp_path, "beta")
    a2a_settings.set_enabled(other, True, actor="test")
    _, other_key = a2a_settings.create_credential(other, "peer", "operator", actor="test")
    theirs = rpc("beta", send_body(), other_key).json()["result"]["id"]
    for method in ("tasks/get", "tasks/cancel"):
        answer = rpc("alpha", {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"id": theirs}}, key).json()
        assert answer["error"]["code"] == -32001
    assert A2ATaskLink.objects.get(a2a_id=theirs).task.status != "cancelled"


@pytest.mark.django_db(transaction=True)
def test_message_stream_follows_the_task_and_the_members_live_text(served):
    """The stream's polls run in a thread (as under daphne): the rows must be committed."""
    from asgiref.sync import sync_to_async

    from veronica.swarm import events

    space, key = served
    response = rpc("alpha", send_body(method="message/stream"), key)
    assert response["Content-Type"] == "text/event-stream" and response.is_async

    def decode(chunk):
        return json.loads(chunk.decode().removeprefix("data: "))["result"]

    async def read():
        seen = []
        async for chunk in response.streaming_content:
            seen.append(decode(chunk))
            if len(seen) == 1:
                task = await sync_to_async(lambda: A2ATaskLink.objects.select_related("task__assignee").get(a2a_id=seen[0]["id"]).task)()
                await sync_to_async(lambda: (events.emit(space.pk, "agent.text", member=task.assignee, text="Working on the report"),
                                             ledger.complete(task, actor="boss", result="Done: report.md")))()
        return seen

    seen = asyncio.run(read())
    assert seen[0]["kind"] == "task" and seen[0]["status"]["state"] == "working"
    texts = [e["status"]["message"]["parts"][0]["text"] for e in seen if e.get("kind") == "status-update" and "message" in e["status"]]
    assert "Working on the report" in texts
    assert seen[-2]["kind"] == "artifact-update" and seen[-2]["artifact"]["parts"][0]["text"] == "Done: report.md"
    assert seen[-1]["kind"] == "status-update" and seen[-1]["final"] is True and seen[-1]["status"]["state"] == "completed"
