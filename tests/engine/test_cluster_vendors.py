"""The real django-q2 cluster (separate worker processes) against the mock vendor servers:
streaming, faults, prompt caching and cancel over real HTTP, on this suite's database."""
from __future__ import annotations

import time

import pytest
from django.db import close_old_connections

from tests.conftest import make_space
from tests.harness import isolate_queue, qcluster, wait_for
from tests.vendors import faults as f
from tests.vendors.mock_anthropic import MockAnthropic
from tests.vendors.mock_openai import MockOpenAI
from veronica.swarm import bus
from veronica.engine import supervisor
from veronica.models import Event, Member, Message, Run, UsageDay

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def own_queue():
    isolate_queue()
    yield
    close_old_connections()


def worker_on(space, model: str) -> Member:
    w1 = supervisor.get_member(space, "w1")
    Member.objects.filter(pk=w1.pk).update(model=model)
    return Member.objects.get(pk=w1.pk)


def drained(member: Member) -> bool:
    close_old_connections()
    idle = not Member.objects.get(pk=member.pk).lease_token
    return idle and not Message.objects.filter(recipient=member, read_at__isnull=True).exists()


def test_anthropic_in_the_cluster_retries_streams_and_caches(tmp_path):
    space = make_space(tmp_path, workers=("w1",))
    w1 = worker_on(space, "anthropic:claude-haiku-4-5")
    (tmp_path / "alpha" / "notes.txt").write_text("hello\n")
    with MockAnthropic(api_key="ak-cluster") as mock:
        mock.push(f.rate_limit(retry_after=0.5), f.tool_call("read_file", {"path": "notes.txt"}),
                  f.overloaded(), f.text("Read it: it says hello.", chunks=4, delay=0.3))
        with qcluster(workers=2, ANTHROPIC_BASE_URL=mock.base_url, ANTHROPIC_API_KEY="ak-cluster", VERONICA_MODEL_BACKOFF="0.05"):
            bus.send(space, "boss", "w1", "read notes.txt")
            wait_for(lambda: len(mock.model_requests()) >= 4 and drained(w1), 90, message="run finished")
    requests = mock.model_requests()
    assert len(requests) == 4 and all(r.body["tools"][-1].get("cache_control") for r in requests)
    events = {kind: [e.payload for e in Event.objects.filter(space=space, kind=kind).order_by("seq")]
              for kind in ("agent.retry", "agent.delta", "agent.text")}
    assert [e["reason"] for e in events["agent.retry"]] == ["HTTP 429 rate limit", "HTTP 529 overloaded"]
    assert len(events["agent.delta"]) >= 2 and events["agent.text"][-1]["text"] == "Read it: it says hello."
    usage = UsageDay.objects.get(member=w1)
    assert usage.cache_write_tokens > 0 and usage.cache_read_tokens > 0 and usage.usd > 0
    assert Run.objects.filter(member=w1, outcome="done").exists()


def test_suspend_in_the_cluster_closes_the_vendor_connection(tmp_path):
    space = make_space(tmp_path, workers=("w1",))
    w1 = worker_on(space, "openai:gpt-4.1-mini")
    with MockOpenAI(api_key="sk-cluster") as mock:
        mock.push(f.generate(chunks=600, delay=0.05))  # 30 s of billed tokens unless the client hangs up
        with qcluster(workers=2, OPENAI_BASE_URL=mock.base_url, OPENAI_API_KEY="sk-cluster"):
            bus.send(space, "boss", "w1", "write a long essay")
            wait_for(lambda: mock.model_requests() and mock.model_requests()[0].chunks_sent > 5, 60, message="streaming")
            asked = time.monotonic()
            supervisor.suspend(w1, actor="test")
            record = mock.model_requests()[0]
            wait_for(lambda: record.disconnected_at is not None, 10, interval=0.05, message="the vendor saw the disconnect")
            closed_after = record.disconnected_at - asked
            sent = record.chunks_sent
            time.sleep(0.5)
            assert record.chunks_sent == sent, "the vendor kept generating after the disconnect"
            wait_for(lambda: Run.objects.filter(member=w1, ended_at__isnull=False).exists(), 15, message="run ended")
    assert closed_after < 3.0  # heartbeat poll (1 s) + abort, not the 120 s read timeout
    assert sent < 600 and Run.objects.get(member=w1).outcome == "aborted"
    usage = UsageDay.objects.get(member=w1)  # the tokens streamed before the hang-up were billed: metered, as an estimate
    assert usage.model_calls == 1 and usage.estimated_calls == 1 and usage.output_tokens > 0
