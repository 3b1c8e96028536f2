"""`doctor` probes every distinct model endpoint for real (list models) against the mock vendors."""
from __future__ import annotations

import io
import shutil
import tarfile
from datetime import timedelta

import pytest
from django.utils import timezone
from django.core.management import CommandError, call_command

from tests.conftest import make_space
from tests.vendors.mock_anthropic import MockAnthropic
from tests.vendors.mock_openai import MockOpenAI
from veronica.engine import leases, supervisor
from veronica.engine.ticker import ROLE


@pytest.fixture
def vendors(settings, monkeypatch):
    with MockOpenAI(api_key="sk-good") as openai_mock, MockAnthropic(api_key="ak-good") as anthropic_mock:
        settings.OPENAI_BASE_URL = openai_mock.base_url
        settings.ANTHROPIC_BASE_URL = anthropic_mock.base_url
        monkeypatch.setenv("OPENAI_API_KEY", "sk-good")
        monkeypatch.setenv("ANTHROPIC_API_KEY", "ak-good")
        yield openai_mock, anthropic_mock


@pytest.fixture(autouse=True)
def ticker_alive(db):
    """A qcluster's engine ticker holds its role (doctor fails without one: see below)."""
    leases.hold_role(ROLE, "test-host:1:abc", 60)


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


def test_doctor_fails_when_no_engine_ticker_is_alive(db, settings):
    from veronica.models import EngineLease

    text, error = doctor_offline()
    assert not error and "engine ticker: alive (test-host:1:abc)" in text
    leases.release_role(ROLE, "test-host:1:abc")  # the qcluster stopped cleanly
    text, error = doctor_offline()
    assert "1 problem(s)" in error and "engine ticker: none alive, so no qcluster is running" in text
    assert "all checks passed" not in text
    leases.hold_role(ROLE, "test-host:2:def", 60)
    EngineLease.objects.filter(name=ROLE).update(expires_at=timezone.now() - timedelta(minutes=5))  # it was killed
    assert "engine ticker: none alive" in doctor_offline()[0]


def doctor_offline(*args: str) -> tuple[str, str]:
    out = io.StringIO()
    try:
        call_command("doctor", *args, "--no-probe", stdout=out)
    except CommandError as exc:
        return out.getvalue(), str(exc)
    return out.getvalue(), ""


def broken_manifest(tmp_path, demo_manifest):
    folder = tmp_path / "broken"
    shutil.copytree(demo_manifest, folder)
    (folder / "space.toml").write_text((folder / "space.toml").read_text().replace("spawn_cap = 2", "spawn_cap = 999"))
    (folder / "members" / "scout" / "member.toml").write_text('role = "worker"\nbudget = "lots"\n')
    (folder / "members" / "analyst" / "persona.md").unlink()
    (folder / "members" / "lead" / "skills" / "Bad Name.md").write_text("a skill")
    (folder / "skills" / "reporting.md").write_text("---\ndescription: never closed\n")
    (folder / "rules").mkdir()
    (folder / "rules" / "style.toml").write_text('rules = "not a list"\n')
    return folder


EXPECTED = [("space.toml", "settings.spawn_cap"), ("members/scout/member.toml", "budget"),
            ("members/analyst/persona.md", "file"), ("members/lead/skills/Bad Name.md", "name"),
            ("skills/reporting.md", "front matter"), ("rules/style.toml", "rules")]


def row_counts() -> dict[str, int]:
    from django.apps import apps

    return {m._meta.label: m.objects.count() for m in apps.get_models() if not m._meta.label.startswith("django_q.")}


def test_doctor_preflights_a_manifest_folder_naming_every_files_error_and_writing_nothing(db, tmp_path, demo_manifest):
    folder = broken_manifest(tmp_path, demo_manifest)
    before = row_counts()
    text, error = doctor_offline(str(folder))
    assert row_counts() == before, "nothing was written"
    for path, field in EXPECTED:
        assert f"✗ manifest: {folder / path}: {field}:" in text, (path, text)
    assert f"{len(EXPECTED)} problem(s)" in error
    with pytest.raises(CommandError, match="spawn_cap"):  # what register would have said: the first error only
        call_command("register", str(folder), stdout=io.StringIO())


def test_doctor_preflights_an_archive_naming_files_as_in_the_archive(db, tmp_path, demo_manifest):
    folder = broken_manifest(tmp_path, demo_manifest)
    archive = tmp_path / "team.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname="team")
    before = row_counts()
    text, error = doctor_offline(str(archive))
    assert row_counts() == before
    for path, field in EXPECTED:
        assert f"✗ manifest: {path}: {field}:" in text, (path, text)
    assert str(tmp_path) not in text.replace(str(archive), "")
    (tmp_path / "junk.tar.gz").write_bytes(b"not an archive")
    text, error = doctor_offline(str(tmp_path / "junk.tar.gz"))
    assert "✗ manifest: archive is not a readable tar or tar.gz" in text and error


def test_doctor_passes_a_good_manifest_and_checks_its_members_models(db, demo_manifest, vendors, tmp_path):
    folder = tmp_path / "team"
    shutil.copytree(demo_manifest, folder)
    member = folder / "members" / "scout" / "member.toml"
    member.write_text(member.read_text().replace('model = "offline"', 'model = "openai:gpt-mock"'))
    before = row_counts()
    out = io.StringIO()
    call_command("doctor", str(folder), stdout=out)
    text = out.getvalue()
    assert row_counts() == before
    assert "✓ manifest" in text and "space 'demo' (new), 3 member(s), leader lead" in text
    assert "no price known for openai:gpt-mock (used by manifest/scout)" in text, "its model was checked before register"
