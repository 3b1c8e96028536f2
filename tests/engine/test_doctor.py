"""`doctor` probes every distinct model endpoint for real (list models) against the mock vendors."""
from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from tests.conftest import make_space
from tests.vendors.mock_anthropic import MockAnthropic
from tests.vendors.mock_openai import MockOpenAI
from veronica.engine import supervisor


@pytest.fixture
def vendors(settings, monkeypatch):
    with MockOpenAI(api_key="sk-good") as openai_mock, MockAnthropic(api_key="ak-good") as anthropic_mock:
        settings.OPENAI_BASE_URL = openai_mock.base_url
        settings.ANTHROPIC_BASE_URL = anthropic_mock.base_url
        monkeypatch.setenv("OPENAI_API_KEY", "sk-good")
        monkeypatch.setenv("ANTHROPIC_API_KEY", "ak-good")
        yield openai_mock, anthropic_mock


@pytest.fixture
def team(db, tmp_path):
    space = make_space(tmp_path, workers=())
    supervisor.add_member(space, "gpt", model="openai:gpt-mock", actor="test")
    supervisor.add_member(space, "gpt2", model="openai:gpt-mock", actor="test")
    supervisor.add_member(space, "claude", model="anthropic:claude-mock", actor="test")
    return space


def doctor() -> tuple[str, str]:
    out = io.StringIO()
    try:
        call_command("doctor", stdout=out)
    except CommandError as exc:
        return out.getvalue(), str(exc)
    return out.getvalue(), ""


def test_one_probe_per_distinct_endpoint_and_a_clean_bill(vendors, team):
    openai_mock, anthropic_mock = vendors
    text, error = doctor()
    assert not error, text
    assert f"openai endpoint {openai_mock.base_url}: reachable, key accepted" in text
    assert f"anthropic endpoint {anthropic_mock.base_url}: reachable, key accepted" in text
    assert [r.path for r in openai_mock.requests] == ["/v1/models"]  # two members, one endpoint, one probe
    assert [r.path for r in anthropic_mock.requests] == ["/v1/models"]
    assert "no price known for openai:gpt-mock" in text and "no price known for anthropic:claude-mock" in text


def test_a_wrong_key_is_caught(vendors, team, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "ak-typo")
    text, error = doctor()
    assert "1 problem(s)" in error
    assert "the key was refused (HTTP 401): check ANTHROPIC_API_KEY" in text


def test_a_dead_base_url_is_caught(vendors, team, settings):
    from tests.console.servers import free_port

    settings.OPENAI_BASE_URL = f"http://127.0.0.1:{free_port()}/v1"
    text, error = doctor()
    assert error and "cannot connect" in text and "check OPENAI_BASE_URL" in text


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
def test_a_doubled_v1_is_caught(vendors, team, settings, kind):
    openai_mock, anthropic_mock = vendors
    if kind == "anthropic":
        settings.ANTHROPIC_BASE_URL = anthropic_mock.base_url + "/v1"  # the SDK adds /v1 itself
    else:
        settings.OPENAI_BASE_URL = openai_mock.base_url + "/v1"
    text, error = doctor()
    assert error and "doubled /v1" in text and ("ANTHROPIC_BASE_URL" if kind == "anthropic" else "OPENAI_BASE_URL") in text


def test_a_model_with_a_known_or_overridden_price_gets_no_warning(vendors, db, tmp_path, settings):
    space = make_space(tmp_path, workers=())
    supervisor.add_member(space, "mini", model="openai:gpt-4.1-mini", actor="test")
    supervisor.add_member(space, "local", model="openai:gpt-mock", actor="test")
    settings.MODEL_PRICES = {"openai:gpt-mock": {"input": 0, "output": 0}}
    text, _ = doctor()
    assert "no price known" not in text
