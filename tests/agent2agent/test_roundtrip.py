"""A2A both ways against an independent implementation of the protocol (fasta2a, pydantic's):

* they call us: fasta2a's client against a real daphne serving veronica.asgi, while the member's
  run (the engine, in this process, the LLM vendor scripted) does the task;
* we call them: a fasta2a server (uvicorn, its own process) registered as a remote agent and
  called through the a2a__<name> tool, gated like any tool that leaves the space;
* between spaces: one space calls another of the same deployment through the same path.

Streamed answer, cancel and an auth failure in each direction."""
from __future__ import annotations

import asyncio
import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from django.utils import timezone
from fasta2a.client import A2AClient, UnexpectedResponseError
from fasta2a.schema import CancelTaskResponse, CancelTaskRequest, a2a_request_ta
from pydantic import TypeAdapter

from tests.conftest import make_space
from tests.console.servers import ServerProcess, free_port, server_env
from tests.engine.conftest import scripted as script  # noqa: F401 (a fixture: the LLM vendor, scripted)
from veronica.swarm import a2a_calls, a2a_client, a2a_settings, bus
from veronica.agent.loop import run_tool
from veronica.agent.providers.base import Reply, ToolCall, Usage
from veronica.agent.tools import ToolContext, tools_for
from veronica.engine import approvals, runner, supervisor, tick
from veronica.models import A2ACall, A2ATaskLink, Approval, Event, Turn, Wake
from veronica.ops.outbound import Refused
from veronica.plumbing.errors import VeronicaError

PEER = str(Path(__file__).resolve().parent / "peer.py")
TOKEN = "peer-secret"

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def loopback_allowed(settings):
    settings.A2A_ALLOW_HOSTS = ["127.0.0.1"]  # the peers listen on loopback, refused by the hosted default


@pytest.fixture(scope="module")
def web(django_db_setup):
    server = ServerProcess.daphne(server_env())
    yield server
    server.stop()


@pytest.fixture(scope="module")
def peer(django_db_setup):
    port = free_port()
    server = ServerProcess([sys.executable, PEER, str(port), TOKEN], server_env(), "fasta2a-peer")
    server.url = f"http://127.0.0.1:{port}"
    server.wait_http("/.well-known/agent-card.json", 30)
    yield server
    server.stop()


def message(text: str) -> dict:
    return {"role": "user", "parts": [{"text": text}], "message_id": uuid.uuid4().hex}


def client_for(web, key: str | None, slug: str = "alpha") -> A2AClient:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return A2AClient(f"{web.url}/a2a/{slug}/", http_client=httpx.AsyncClient(headers=headers, timeout=60))


def finish(reply_text: str, result: str):
    """The leader's scripted run: it says something, reports its task done, and ends."""
    def steps(task_pk: int):
        return [Reply(text=reply_text, tool_calls=[ToolCall(id="c1", name="task_done", args={"task_id": task_pk, "result": result})],
                      usage=Usage(input=100, output=10)), "done"]
    return steps


def wait_for(predicate, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


@pytest.fixture
def alpha(tmp_path):
    space = make_space(tmp_path, "alpha")
    a2a_settings.set_enabled(space, True, actor="test")
    _, key = a2a_settings.create_credential(space, "outsider", "operator", actor="test")
    return space, key


def test_they_call_us_send_stream_cancel_and_a_refused_credential(web, alpha, script):
    space, key = alpha
    boss = supervisor.get_member(space, "boss")

    async def send_then_get():
        client = client_for(web, key)
        sent = await client.send_message(message("Summarise the open tasks"))
        return sent["result"]["task"]

    task = asyncio.run(send_then_get())
    assert task["status"]["state"] == "working"
    link = A2ATaskLink.objects.get(a2a_id=task["id"])
    assert link.task.creator_name == "a2a:outsider" and link.task.assignee == boss
    script(*finish("Two tasks are open.", "2 open tasks")(link.task.pk))
    assert runner.wake(boss.pk, "task") == "done"

    async def get():
        return await client_for(web, key).get_task(task["id"])

    got = asyncio.run(get())["result"]
    assert got["status"]["state"] == "completed" and got["artifacts"][0]["parts"][0]["text"] == "2 open tasks"

    # streamed: the first event is the task; the member's run starts then, its text and end follow
    async def stream():
        events = []
        async for event in client_for(web, key).stream_message(message("Stream me an answer")):
            events.append(event["result"])
            if len(events) == 1:
                pk = A2ATaskLink.objects.filter(a2a_id=event["result"]["task"]["id"]).values_list("task_id", flat=True)
                await asyncio.to_thread(lambda: (script(*finish("Thinking aloud", "streamed result")(pk.get())),
                                                 runner.wake(boss.pk, "task")))
        return events

    events = asyncio.run(stream())
    updates = [e["status_update"] for e in events if "status_update" in e]
    assert any(u["status"].get("message", {}).get("parts", [{}])[0].get("text") == "Thinking aloud" for u in updates)
    assert [e["artifact_update"]["artifact"]["parts"][0]["text"] for e in events if "artifact_update" in e] == ["streamed result"]
    assert updates[-1]["status"]["state"] == "completed"

    # cancel, with fasta2a's own request and response types
    async def cancel():
        client = client_for(web, key)
        started = (await client.send_message(message("Something long")))["result"]["task"]
        request = CancelTaskRequest(jsonrpc="2.0", id="c1", method="tasks/cancel", params={"id": started["id"]})
        response = await client.http_client.post("/", content=a2a_request_ta.dump_json(request, by_alias=True),
                                                 headers={"Content-Type": "application/json"})
        return TypeAdapter(CancelTaskResponse).validate_json(response.content)

    cancelled = asyncio.run(cancel())
    assert cancelled["result"]["status"]["state"] == "canceled"
    assert A2ATaskLink.objects.get(a2a_id=cancelled["result"]["id"]).task.status == "cancelled"

    # a wrong credential: HTTP 401 and nothing written
    tasks = A2ATaskLink.objects.count()

    async def refused():
        with pytest.raises(UnexpectedResponseError) as caught:
            await client_for(web, "a2a_not-a-key").send_message(message("let me in"))
        return caught.value.status_code

    assert asyncio.run(refused()) == 401
    assert A2ATaskLink.objects.count() == tasks


def test_we_call_them_through_the_gated_tool_with_timeout_cancel_and_a_refused_credential(peer, tmp_path, script, django_user_model):
    space = make_space(tmp_path, "gamma")
    a2a_settings.add_remote(space, a2a_settings.check_remote(
        {"name": "echo", "card_url": f"{peer.url}/.well-known/agent-card.json", "token": TOKEN, "timeout": 20}), actor="test")
    w1 = supervisor.set_permission_mode(supervisor.get_member(space, "w1"), "default", actor="test")
    tools = tools_for(w1)
    tool = tools["a2a__echo"]
    assert tool.needs_approval and tool.reaches_out and "fasta2a" in tool.description

    # through the loop: held by the gate, approved, called, its answer the tool's result
    script(("a2a__echo", {"message": "hello from veronica"}), "done")
    bus.send(space, "boss", "w1", "ask the echo agent")
    assert runner.wake(w1.pk, "message") == "waiting"
    approvals.decide(Approval.objects.get(tool_name="a2a__echo"), approve=True, user=django_user_model.objects.create_user("op"))
    assert runner.wake(w1.pk, "resume") == "done"
    assert Turn.objects.get(role="tool", tool_name="a2a__echo").content == "echo: hello from veronica"
    called = Event.objects.get(kind="a2a.called")
    assert called.payload["ok"] and called.payload["state"] == "completed" and called.payload["remote"] == "echo"
    from veronica.web import run_trace
    from veronica.models import Run

    run = Run.objects.filter(member=w1).order_by("-pk").first()  # the resumed run made the call: the run page shows it
    spans, _ = run_trace.spans_of(run_trace._run_events(run))
    call_span = next(sp for sp in spans if sp.name == "a2a__echo")
    assert any(m.startswith("remote task ") and "completed" in m for m in call_span.marks)

    # a remote task past the timeout is cancelled there, and the model reads why
    a2a_settings.remove_remote(space, "echo", actor="test")
    a2a_settings.add_remote(space, a2a_settings.check_remote(
        {"name": "echo", "card_url": f"{peer.url}/.well-known/agent-card.json", "token": TOKEN, "timeout": 2}), actor="test")
    ctx = ToolContext(member=w1, space=space)
    result = run_tool(tools_for(w1)["a2a__echo"], ctx, {"message": "slow, please"})
    assert result.startswith("error:") and "did not finish within 2 s (cancelled)" in result
    remote_id = result.split("remote task ")[1].split()[0]
    assert a2a_client.get_task(f"{peer.url}/", TOKEN, remote_id).status.state.value == "canceled"

    # a wrong token: the peer answers 401 and the tool says so
    a2a_settings.remove_remote(space, "echo", actor="test")
    a2a_settings.add_remote(space, a2a_settings.check_remote(
        {"name": "echo", "card_url": f"{peer.url}/.well-known/agent-card.json", "token": "wrong"}), actor="test")
    result = run_tool(tools_for(w1)["a2a__echo"], ctx, {"message": "hi"})
    assert "refused our credential (HTTP 401)" in result


def test_a_token_kept_as_a_space_secret_is_sent_and_never_stored_with_the_remote(peer, tmp_path, settings):
    from cryptography.fernet import Fernet

    from veronica.swarm import secrets
    from veronica.models import A2ARemote

    settings.SECRETS_KEYS = [Fernet.generate_key().decode()]
    space = make_space(tmp_path, "sigma")
    card = f"{peer.url}/.well-known/agent-card.json"
    with pytest.raises(VeronicaError, match="names secret PEER_TOKEN, which is not set") as refused:
        a2a_settings.add_remote(space, a2a_settings.check_remote(
            {"name": "echo", "card_url": card, "token": "${secret:PEER_TOKEN}"}), actor="test")
    assert refused.value.field == "a2a.remotes.echo.token" and not A2ARemote.objects.exists()
    secrets.set_secret(space, "PEER_TOKEN", TOKEN, actor="test")
    a2a_settings.add_remote(space, a2a_settings.check_remote(
        {"name": "echo", "card_url": card, "token": "${secret:PEER_TOKEN}", "timeout": 20}), actor="test")
    assert TOKEN not in str(A2ARemote.objects.values_list().get())
    w1 = supervisor.get_member(space, "w1")
    ctx = ToolContext(member=w1, space=space)
    assert run_tool(tools_for(w1)["a2a__echo"], ctx, {"message": "hi"}) == "echo: hi"  # the peer took the bearer
    # the member's own secret of the name shadows the space's: a wrong one is refused by the peer
    secrets.set_secret(space, "PEER_TOKEN", "wrong-token-value", member=w1, actor="test")
    assert "refused our credential (HTTP 401)" in run_tool(tools_for(w1)["a2a__echo"], ctx, {"message": "hi"})
    secrets.delete_secret(space, "PEER_TOKEN", member=w1, actor="test")
    secrets.delete_secret(space, "PEER_TOKEN", actor="test")
    result = run_tool(tools_for(w1)["a2a__echo"], ctx, {"message": "hi"})
    assert result.startswith("error:") and "names secret PEER_TOKEN, which is not set for w1 or the space" in result


def test_a_long_remote_task_parks_the_run_and_its_end_wakes_the_member(peer, tmp_path, script, settings, monkeypatch):
    settings.A2A_INLINE_SECONDS = 0  # park as soon as the remote task is accepted
    woken = []
    monkeypatch.setattr("veronica.engine.wakes.enqueue_wake", lambda pk, source: woken.append((pk, source)))
    space = make_space(tmp_path, "delta")
    a2a_settings.add_remote(space, a2a_settings.check_remote(
        {"name": "echo", "card_url": f"{peer.url}/.well-known/agent-card.json", "token": TOKEN, "timeout": 60}), actor="test")
    w1 = supervisor.get_member(space, "w1")
    script(("a2a__echo", {"message": "later 1"}), "done")
    bus.send(space, "boss", "w1", "ask the echo agent something long")
    assert runner.wake(w1.pk, "message") == "waiting"  # the run ended: no worker holds the call
    parked = A2ACall.objects.get()
    assert parked.finished_at is None and parked.remote_task_id and parked.tool_call_id == "c1"
    w1.refresh_from_db()
    assert w1.phase == "waiting-input" and w1.run_status == "idle"
    assert runner.wake(w1.pk, "resume") == "waiting"  # woken early: still parked, still no result
    wait_for(lambda: a2a_calls.poll_parked())  # the engine tick's duty
    assert (w1.pk, "resume") in woken
    # were that wake lost, the tick's sweep wakes a member whose parked call ended a while ago
    A2ACall.objects.update(finished_at=timezone.now() - timedelta(hours=1))
    Wake.objects.filter(member=w1).update(created_at=timezone.now() - timedelta(hours=1))
    assert w1.pk in tick.sweep_unread()
    assert runner.wake(w1.pk, "resume") == "done"
    assert Turn.objects.get(role="tool", tool_name="a2a__echo").content == "echo: later 1"
    assert A2ACall.objects.get().consumed and Event.objects.filter(kind="a2a.called", payload__parked=True).exists()


def test_a_hosted_deployment_refuses_internal_remote_agents(settings):
    settings.A2A_ALLOW_HOSTS = []
    with pytest.raises(Refused) as caught:
        a2a_settings.check_remote({"name": "inside", "card_url": "http://127.0.0.1:9/.well-known/agent-card.json"})
    assert caught.value.field == "a2a.remotes.inside.card_url" and "VERONICA_A2A_ALLOW_HOSTS" in str(caught.value)


def test_two_spaces_delegate_to_each_other_through_the_same_path(web, alpha, tmp_path, script):
    space, key = alpha
    beta = make_space(tmp_path, "beta")
    a2a_settings.add_remote(beta, a2a_settings.check_remote(
        {"name": "alpha", "card_url": f"{web.url}/a2a/alpha/.well-known/agent-card.json", "token": key, "timeout": 60}), actor="test")
    x1 = supervisor.get_member(beta, "w1")
    answers = []
    caller = threading.Thread(target=lambda: answers.append(
        run_tool(tools_for(x1)["a2a__alpha"], ToolContext(member=x1, space=beta), {"message": "How many tasks are open?"},
                                 savepoint=False)))  # as the loop runs it: outside any transaction
    caller.start()
    try:
        link = wait_for(lambda: A2ATaskLink.objects.filter(space=space).first())
        assert link.caller == "a2a:outsider" and link.task.assignee.name == "boss"
        script(*finish("Counting", "alpha has 3 open tasks")(link.task_id))
        assert runner.wake(supervisor.get_member(space, "boss").pk, "task") == "done"
    finally:
        caller.join(90)
    assert answers == ["alpha has 3 open tasks"]
    # alpha's side: the mail came from beta's credential name, shown as the sender
    assert space.messages.filter(sender_name="a2a:outsider").exists()
