"""Secrets end to end on the served stack (daphne + two qclusters; hosted: PostgreSQL + Redis): the
owner sets secrets through the API, a message through the API wakes a member in a worker process,
its model call carries the member's provider key (a secret, not the server's key), its run_command
gets the secret declared for commands, and the value is nowhere: not in what the model was sent
back, not in the transcript or the events, not in the workers' logs."""
from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from cryptography.fernet import Fernet

from tests.console.conftest import make_world
from tests.console.servers import ServerProcess, server_env
from tests.vendors.faults import text, tool_call
from tests.vendors.mock_openai import MockOpenAI
from veronica.swarm import access
from veronica.engine import supervisor
from veronica.models import Event, Turn

KEY = Fernet.generate_key().decode()
PROVIDER_KEY, DEPLOY = "sk-member-secret-7d1e9a", "deploy-token-55f0c3"


@pytest.fixture(scope="module")
def vendor():
    mock = MockOpenAI(api_key=PROVIDER_KEY).start()
    yield mock
    mock.stop()


@pytest.fixture(scope="module")
def stack(django_db_setup, vendor):
    env = server_env(VERONICA_SECRETS_KEY=KEY, OPENAI_BASE_URL=vendor.base_url, OPENAI_API_KEY="sk-the-servers-own-wrong-key",
                     VERONICA_COMMAND_SANDBOX="none", VERONICA_MODEL_STREAM="0")
    started: list[ServerProcess] = []
    try:  # a server that fails to start must not leave the ones before it running
        started.append(ServerProcess.daphne(env))
        for _ in range(2):
            started.append(ServerProcess.qcluster(env))
        yield started[0], started[1:]
    finally:
        for server in reversed(started):
            server.stop()


def wait_for(condition, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.3)
    raise AssertionError("timed out")


def test_a_members_secrets_reach_its_model_call_and_command_and_nothing_shows_the_values(transactional_db, tmp_path, settings,
                                                                                         stack, vendor):
    web, workers = stack
    settings.SECRETS_KEYS = [KEY]
    world = make_world(tmp_path)
    w1 = supervisor.get_member(world.space, "w1")
    w1 = supervisor.edit_member(w1, {"model": "openai:gpt-4.1"}, actor="test")
    supervisor.set_permission_mode(w1, "bypass", actor="test")  # run_command runs without an approval
    _, key = access.create_token(world.owner, "script")
    api = httpx.Client(base_url=web.url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    for body in ({"name": "OPENAI_API_KEY", "value": PROVIDER_KEY}, {"name": "DEPLOY_TOKEN", "value": DEPLOY, "in_commands": True}):
        made = api.post("/api/spaces/alpha/members/w1/secrets/", json=body)
        assert made.status_code == 201 and body["value"] not in made.text
    vendor.push(tool_call("run_command", {"command": 'echo "deploying with $DEPLOY_TOKEN"'}), text("deployed"))
    assert api.post("/api/spaces/alpha/messages/", json={"to": "w1", "body": "deploy please"}).status_code == 201

    result = wait_for(lambda: Turn.objects.filter(session__member=w1, role="tool").first())
    assert "deploying with [secret DEPLOY_TOKEN]" in result.content
    wait_for(lambda: len(vendor.model_requests()) >= 2)
    requests = vendor.model_requests()
    assert all({k.lower(): v for k, v in r.headers.items()}.get("authorization") == f"Bearer {PROVIDER_KEY}" for r in requests)  # the secret, not the server's key
    assert DEPLOY not in str(requests[1].body) and "[secret DEPLOY_TOKEN]" in str(requests[1].body)
    everything = [t.content for t in Turn.objects.all()] + [str(e.payload) for e in Event.objects.all()]
    assert not any(DEPLOY in t or PROVIDER_KEY in t for t in everything)
    for server in workers:
        assert DEPLOY not in Path(server.log.name).read_text(errors="replace")
