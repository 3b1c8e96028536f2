"""Provider limits and fallbacks (issue 27.4), on this suite's database: the embedded limiter (SQLite)
or, in hosted mode, the Redis one. The mock vendors count requests in flight and answer 429 above a
scripted capacity, so "no call over the cap" and "no 429 reaching a member" are observed at the
vendor's edge."""
from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
from django.db import close_old_connections

from tests.conftest import make_space
from tests.harness import REPO, isolate_queue, qcluster, wait_for, worker_env
from tests.engine.test_live_vendor import anthropic_mock, openai_mock  # noqa: F401 - the mock vendors, as fixtures
from tests.engine.test_tracing import spans  # noqa: F401 - an in-memory span exporter
from tests.vendors import faults as f
from veronica.swarm import bus
from veronica.portable import archive as portable, manifest
from veronica.agent.providers import get_provider, limits, validate_fallback
from veronica.agent.providers.fallback import FallbackProvider
from veronica.agent.providers.limit_config import Limit, LimitConfigError, limits_for, parse
from veronica.agent.providers.limiter_db import DbLimiter
from veronica.engine import runner, supervisor
from veronica.plumbing.errors import VeronicaError
from veronica.models import Event, Member, Run

NEVER = lambda: False  # noqa: E731


@pytest.fixture(params=["deployment", "database"])
def fresh_backend(request, settings):
    """The deployment's limiter (Redis in hosted mode), and the database one on this suite's database."""
    if request.param == "database" and not settings.REDIS_URL:
        pytest.skip("embedded mode: the deployment's limiter is the database one")
    limits.reset_backend(DbLimiter() if request.param == "database" else None)
    yield limits.backend()
    limits.reset_backend()


# --- configuration -----------------------------------------------------------------------------------------

def test_limits_parse_from_toml_and_json_and_apply_per_endpoint_then_model():
    toml = parse('[openai]\nconcurrency = 5\nrpm = 600\n["openai:gpt-4o"]\ntpm = 1000\n["http://vllm:8000/v1/"]\nconcurrency = 2\n')
    assert toml["openai"] == Limit("openai", concurrency=5, rpm=600) and toml["http://vllm:8000/v1"].concurrency == 2
    assert parse('{"anthropic": {"concurrency": 3}}')["anthropic"].concurrency == 3
    assert [lim.key for lim in limits_for(toml, "openai:gpt-4o", "https://api.openai.com/v1")] == ["openai", "openai:gpt-4o"]
    assert [lim.key for lim in limits_for(toml, "openai:m", "http://vllm:8000/v1")] == ["http://vllm:8000/v1"]  # the URL wins
    assert limits_for(toml, "anthropic:x", "https://api.anthropic.com") == []


@pytest.mark.parametrize("raw, field, words", [
    ('[openai]\nconcurency = 5', "openai.concurency", "is not a limit"),
    ('[openai]\nconcurrency = 0', "openai.concurrency", "from 1 to"),
    ('[openai]\nrpm = "many"', "openai.rpm", "must be an integer"),
    ('[mistral]\nrpm = 5', "mistral", "must be a provider"),
    ('{"openai": 5}', "openai", "must be a table"),
    ('[openai\nrpm = 5', "VERONICA_PROVIDER_LIMITS", "neither valid TOML nor JSON"),
])
def test_bad_limits_are_refused_naming_the_table_and_field(raw, field, words):
    with pytest.raises(LimitConfigError) as exc:
        parse(raw)
    assert exc.value.field == field and words in str(exc.value) and "VERONICA_PROVIDER_LIMITS" in str(exc.value)


def test_a_bad_limit_stops_start_up_with_the_field_named(tmp_path):
    env = {**worker_env(), "VERONICA_PROVIDER_LIMITS": "[openai]\nconcurrency = -1"}
    proc = subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=REPO, env={
        **env, "DJANGO_SETTINGS_MODULE": "veronica.settings"}, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "['openai'].concurrency=-1 must be an integer from 1" in proc.stderr


# --- the limiter ---------------------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_waiters_are_served_first_come_first_served(fresh_backend):
    store, limit = fresh_backend, Limit("openai:fifo-test", concurrency=1)
    holder = limits.acquire([limit], 1, should_stop=NEVER, store=store)
    tickets = ["first", "second", "third"]
    for t in tickets:
        store.enqueue(limit, t)
        assert store.try_acquire(limit, t, 1)[0] > 0  # the slot is held: everyone queues
    holder.release()
    assert store.try_acquire(limit, "third", 1)[0] > 0 and store.try_acquire(limit, "second", 1)[0] > 0  # not their turn
    assert store.try_acquire(limit, "first", 1)[0] == 0
    store.release(limit, "first", 0)
    assert store.try_acquire(limit, "third", 1)[0] > 0
    assert store.try_acquire(limit, "second", 1)[0] == 0
    store.release(limit, "second", 0)
    assert store.try_acquire(limit, "third", 1)[0] == 0
    store.release(limit, "third", 0)
    assert store.held(limit) == 0


@pytest.mark.django_db(transaction=True)
def test_a_dead_holders_slot_frees_itself_at_its_lease_expiry(fresh_backend):
    store, limit = fresh_backend, Limit("openai:lease-test", concurrency=1, lease_seconds=1)  # below the config's 5 s minimum
    limits.acquire([limit], 1, should_stop=NEVER, store=store)  # never released: its worker "died"
    store.enqueue(limit, "next")
    assert store.try_acquire(limit, "next", 1)[0] > 0
    wait_for(lambda: store.try_acquire(limit, "next", 1)[0] == 0, 30, message="the expired slot taken over")
    store.release(limit, "next", 0)


@pytest.mark.django_db(transaction=True)
def test_requests_per_minute_are_spent_then_queue(fresh_backend):
    store, limit = fresh_backend, Limit("openai:rpm-test", rpm=2)
    for _ in range(2):
        limits.acquire([limit], 1, should_stop=NEVER, store=store).release()
    store.enqueue(limit, "third")
    assert store.try_acquire(limit, "third", 1)[0] > 1  # a refill of one request takes ~30 s at 2 per minute
    store.leave(limit, "third")


@pytest.mark.django_db(transaction=True)
def test_a_queued_call_is_cancellable_and_leaves_the_queue(fresh_backend):
    store, limit = fresh_backend, Limit("openai:cancel-test", concurrency=1)
    holder = limits.acquire([limit], 1, should_stop=NEVER, store=store)
    asked = []
    with pytest.raises(limits.Cancelled):
        limits.acquire([limit], 1, should_stop=lambda: bool(asked.append(1)) or len(asked) > 2, store=store,
                       on_event=lambda e: asked.append(e["type"]))
    assert "queued" in asked
    holder.release()
    limits.acquire([limit], 1, should_stop=NEVER, store=store).release()  # nobody stale ahead of it


@pytest.mark.django_db(transaction=True)
def test_fifty_threads_never_exceed_the_cap_and_no_429_reaches_them(openai_mock, fresh_backend):  # noqa: F811
    openai_mock.configure(latency=0.1, capacity=5, retry_after=1)
    cap = {"openai": Limit("openai", concurrency=5)}
    results, errors = [], []

    def member_call():
        try:
            results.append(get_provider("openai:gpt-mock").complete("sys", [{"role": "user", "content": "hi"}], [],
                                                                    should_stop=NEVER).text)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            close_old_connections()

    with limits.overridden(cap):
        threads = [threading.Thread(target=member_call) for _ in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    stats = openai_mock.stats()
    assert not errors and len(results) == 50
    assert stats["max_in_flight"] <= 5 and stats["over_capacity"] == 0 and stats["model_requests"] == 50


@pytest.mark.cluster
@pytest.mark.django_db(transaction=True)
def test_two_clusters_share_one_cap_end_to_end(tmp_path, openai_mock):  # noqa: F811
    """Two qclusters (separate processes, as two hosts would be), ten members on one endpoint with a
    cap of 2: the vendor never sees a third call at once, and no run sees a 429."""
    isolate_queue()
    openai_mock.configure(latency=0.3, capacity=2, retry_after=1)
    names = tuple(f"w{i}" for i in range(10))
    space = make_space(tmp_path, workers=names)
    Member.objects.filter(space=space).update(model="openai:gpt-mock")
    env = {"OPENAI_BASE_URL": openai_mock.base_url, "OPENAI_API_KEY": "sk-test",
           "VERONICA_PROVIDER_LIMITS": json.dumps({"openai": {"concurrency": 2}})}
    with qcluster(workers=4, **env), qcluster(workers=4, **env):
        for name in names:
            bus.send(space, "boss", name, "hello")
        wait_for(lambda: not close_old_connections() and Run.objects.filter(member__space=space, outcome="done").count()
                 >= len(names), 180, message="every member answered")
    stats = openai_mock.stats()
    assert stats["model_requests"] >= len(names)
    assert stats["max_in_flight"] <= 2 and stats["over_capacity"] == 0
    assert not Event.objects.filter(space=space, kind="agent.retry").exists()  # no 429 reached a member


# --- fallbacks -----------------------------------------------------------------------------------------------

def test_fallback_chains_are_checked_naming_the_field():
    assert validate_fallback(["openai:gpt-4o", " anthropic:claude-haiku-4-5 "], "anthropic:x") == [
        "openai:gpt-4o", "anthropic:claude-haiku-4-5"]
    assert validate_fallback("openai:a, openai:b", "offline") == ["openai:a", "openai:b"]  # a form's text
    for bad, words in ((["mistral:x"], "fallback[0]: model 'mistral:x'"), (["openai:a", "openai:a"], "already in the chain"),
                       (["anthropic:x"], "already in the chain"), ([1], "list of model specs"),
                       (["openai:a", "openai:b", "openai:c", "openai:d", "openai:e"], "the limit is 4")):
        with pytest.raises(VeronicaError) as exc:
            validate_fallback(bad, "anthropic:x")
        assert exc.value.field == "fallback" and words in exc.value.message


def test_an_overloaded_model_falls_back_and_the_switch_is_recorded(space, anthropic_mock, openai_mock, settings):  # noqa: F811
    settings.MODEL_MAX_RETRIES = 1
    w1 = supervisor.edit_member(supervisor.get_member(space, "w1"), {
        "model": "anthropic:claude-sonnet-4-5", "fallback": ["openai:gpt-4.1-mini"]}, actor="test")
    anthropic_mock.push(f.overloaded(), f.overloaded())  # the first try and its one retry
    openai_mock.push(f.text("answered by the fallback"))
    bus.send(space, "boss", "w1", "hello")
    assert runner.wake(w1.pk, "message") == "done"
    switch = Event.objects.get(space=space, kind="model.fallback").payload
    assert switch["from"] == "anthropic:claude-sonnet-4-5" and switch["to"] == "openai:gpt-4.1-mini"
    assert switch["reason"] == "HTTP 529 overloaded"
    called = Event.objects.get(space=space, kind="model.called").payload
    assert called["model"] == "openai:gpt-4.1-mini" and float(called["usd"]) > 0  # the usage carries the model used
    assert Event.objects.filter(space=space, kind="agent.text").last().payload["text"] == "answered by the fallback"
    from veronica.web import run_trace

    spans, _ = run_trace.spans_of(list(Event.objects.filter(space=space).order_by("seq")))
    model_span = next(s for s in spans if s.kind == "model")
    assert model_span.name == "openai:gpt-4.1-mini" and any("switched to openai:gpt-4.1-mini" in e for e in model_span.errors)


def test_a_permanent_error_of_the_members_own_model_does_not_fall_back(settings):
    from veronica.agent.providers.base import ProviderError

    class Broken:
        label = "anthropic:x"

        def complete(self, *a, **k):
            raise ProviderError("HTTP 401", permanent=True, status=401)

    made = []
    chain = FallbackProvider(["anthropic:x", "openai:y"], lambda spec: made.append(spec) or Broken())
    with pytest.raises(ProviderError):
        chain.complete("s", [], [], should_stop=NEVER)
    assert made == ["anthropic:x"]


def test_the_fallback_span_names_the_model_that_answered(spans):  # noqa: F811 - the imported fixture
    from veronica.ops import tracing
    from veronica.agent.providers.base import ProviderError, Reply

    class Down:
        def complete(self, *a, **k):
            raise ProviderError("anthropic: HTTP 529 overloaded: busy", status=529)

    class Up:
        def complete(self, *a, **k):
            return Reply(text="ok", finish_reason="stop")

    chain = FallbackProvider(["anthropic:x", "openai:y"], lambda spec: Down() if spec.startswith("anthropic") else Up())
    seen = []
    reply = tracing.complete(chain, "anthropic:x", "s", [], [], should_stop=NEVER, on_event=seen.append)
    attrs = spans.get_finished_spans()[0].attributes
    assert reply.model == "openai:y" and attrs["veronica.model.fallback"] == "openai:y"
    assert attrs["veronica.model.fallback_from"] == "anthropic:x" and seen[0]["type"] == "fallback"


def test_fallback_through_the_manifest_the_api_the_form_and_the_export(tmp_path, db, client, django_user_model):
    folder = tmp_path / "sp"
    (folder / "members" / "boss").mkdir(parents=True)
    (folder / "space.toml").write_text('name = "FB"\nslug = "fb"\n')
    toml = folder / "members" / "boss" / "member.toml"
    toml.write_text('role = "leader"\nmodel = "anthropic:claude-sonnet-4-5"\nfallback = ["openai:gpt-4o"]\n')
    (folder / "members" / "boss" / "persona.md").write_text("Lead.")
    space = manifest.register(folder, actor="test")
    boss = Member.objects.get(name="boss", space=space)
    assert boss.fallback == ["openai:gpt-4o"]
    exported = portable.export_files(space)
    assert any('fallback = ["openai:gpt-4o"]' in text for name, text in exported.items() if name.endswith("member.toml"))

    owner = django_user_model.objects.create_user("owner", password="pw")
    from veronica.models import SpaceAccess

    SpaceAccess.objects.create(user=owner, space=space, role="owner")
    client.force_login(owner)
    bad = client.patch(f"/api/spaces/{space.slug}/members/boss/", {"fallback": ["openai:gpt-4o", "nope"]},
                       content_type="application/json")
    assert bad.status_code == 400 and bad.json()["field"] == "fallback" and "fallback[1]" in bad.json()["error"]
    good = client.patch(f"/api/spaces/{space.slug}/members/boss/", {"fallback": ["openai:gpt-4o-mini"]},
                        content_type="application/json")
    assert good.status_code == 200 and good.json()["fallback"] == ["openai:gpt-4o-mini"]

    toml.write_text('role = "leader"\nmodel = "openai:a"\nfallback = ["nope"]\n')
    with pytest.raises(VeronicaError) as exc:
        manifest.register(folder, actor="test")
    assert exc.value.field == "fallback" and "fallback[0]" in exc.value.message
