import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from veronica.plumbing import env

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("raw", ["maybe", "2"])
def test_env_bool_rejects_bad_values(monkeypatch, raw):
    monkeypatch.setenv("X_FLAG", raw)
    with pytest.raises(ImproperlyConfigured, match="X_FLAG"):
        env.env_bool("X_FLAG")


def test_env_int_rejects_garbage_and_bounds(monkeypatch):
    monkeypatch.setenv("X_N", "ten")
    with pytest.raises(ImproperlyConfigured, match="not an integer"):
        env.env_int("X_N", 1)
    monkeypatch.setenv("X_N", "0")
    with pytest.raises(ImproperlyConfigured, match="below the minimum 1"):
        env.env_int("X_N", 5, minimum=1)


def test_env_url_rejects_wrong_scheme(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "mysql://x")
    with pytest.raises(ImproperlyConfigured, match="DATABASE_URL"):
        env.env_url("DATABASE_URL", ("postgres",))


def test_learnings_host_hooks_resolve(monkeypatch):
    """settings point learning at the host by dotted path (learning never imports veronica): each path
    imports, and the passes' model factory (veronica.agent.learning_model) gives the offline heuristic
    when no model is named."""
    from django.conf import settings
    from django.utils.module_loading import import_string

    for name in ("LEARNING_SOURCE", "LEARNING_COMPLETE", "LEARNING_AUTO_APPROVE"):
        assert callable(import_string(getattr(settings, name))), name
    monkeypatch.delenv("VERONICA_LEARNING_MODEL", raising=False)
    from learning.offline import complete
    from learning.sources import get_complete

    assert get_complete() is complete


def _manage(args, **extra):
    environ = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    environ.update(extra)
    return subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=environ, capture_output=True, text=True)


HOSTED = dict(DATABASE_URL="postgres://postgres@127.0.0.1:5432/test", REDIS_URL="redis://127.0.0.1:6379/0",
              SECRET_KEY="x" * 20 + "-a-long-random-secret-key-for-deploy-checks", ALLOWED_HOSTS="veronica.example.com",
              SECURE_SSL="1")


def test_check_deploy_is_clean_under_hosted_settings(tmp_path):
    result = _manage(["check", "--deploy", "--fail-level", "WARNING"], **HOSTED, VERONICA_DATA_DIR=str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr


LOGIN_PAGE_HEADERS = """
import json
from django.test import Client
r = Client(HTTP_HOST="veronica.example.com").get("/login/", secure=True)
print(json.dumps({"status": r.status_code, **{k: r.get(k, "") for k in (
    "Content-Security-Policy", "Permissions-Policy", "Cache-Control", "Strict-Transport-Security")}}))
"""


def test_hosted_pages_carry_the_hardening_headers(tmp_path):
    """The deployed configuration as a whole (no database needed for an anonymous login page)."""
    import json

    result = _manage(["shell", "-c", LOGIN_PAGE_HEADERS], **HOSTED, VERONICA_DATA_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr
    headers = json.loads(result.stdout.strip().splitlines()[-1])
    assert headers["status"] == 200
    assert "script-src 'self'" in headers["Content-Security-Policy"] and "unsafe" not in headers["Content-Security-Policy"]
    assert "camera=()" in headers["Permissions-Policy"]
    assert {"private", "no-store"} <= {d.strip() for d in headers["Cache-Control"].split(",")}
    assert headers["Strict-Transport-Security"].startswith("max-age=31536000")


def test_hosted_mode_without_redis_is_refused(tmp_path):
    result = _manage(["check"], DATABASE_URL="postgres://postgres@127.0.0.1:5432/test", VERONICA_DATA_DIR=str(tmp_path))
    assert result.returncode != 0 and "REDIS_URL" in result.stderr


def test_database_mode_matches_the_environment(db, settings):
    """Embedded: SQLite in WAL with IMMEDIATE transactions. Hosted: PostgreSQL + Redis everywhere."""
    from django.db import connection

    if os.environ.get("DATABASE_URL"):
        assert connection.vendor == "postgresql"
        assert settings.CHANNEL_LAYERS["default"]["BACKEND"] == "channels_redis.core.RedisChannelLayer"
        assert settings.Q_CLUSTER["redis"] == os.environ["REDIS_URL"]
        return
    assert connection.vendor == "sqlite" and settings.Q_CLUSTER["orm"] == "default"
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        assert cursor.fetchone()[0] == "wal"
        cursor.execute("PRAGMA busy_timeout")
        assert cursor.fetchone()[0] >= 100
    assert connection.settings_dict["OPTIONS"]["transaction_mode"] == "IMMEDIATE"


def _hosted_database_settings(tmp_path, key: str = "OPTIONS", **extra) -> subprocess.CompletedProcess:
    code = f"import json; from django.conf import settings; print(json.dumps(settings.DATABASES['default'].get('{key}')))"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("VERONICA_DB_")}
    environ.update(DATABASE_URL="postgres://postgres@127.0.0.1:5432/whatever", REDIS_URL="redis://127.0.0.1:6379/9",
                   VERONICA_DATA_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="veronica.settings", **extra)
    return subprocess.run([sys.executable, "-c", f"import django; django.setup(); {code}"], cwd=REPO, env=environ,
                          capture_output=True, text=True)


def test_hosted_database_connections_time_out_and_keep_alive_overridably(tmp_path):
    """A host cut off from PostgreSQL must neither hang nor hold a space's locks forever (issue 10.4)."""
    import json

    result = _hosted_database_settings(tmp_path)
    assert result.returncode == 0, result.stderr
    options = json.loads(result.stdout)
    assert options["connect_timeout"] == 10 and options["keepalives"] == 1 and options["tcp_user_timeout"] == 20000
    assert (options["keepalives_idle"], options["keepalives_interval"], options["keepalives_count"]) == (10, 5, 3)
    for setting in ("statement_timeout=60000", "idle_in_transaction_session_timeout=15000", "lock_timeout=30000"):
        assert f"-c {setting}" in options["options"]
    tuned = json.loads(_hosted_database_settings(tmp_path, VERONICA_DB_IDLE_IN_TRANSACTION_TIMEOUT="3",
                                                 VERONICA_DB_STATEMENT_TIMEOUT="0").stdout)
    assert "idle_in_transaction_session_timeout=3000" in tuned["options"] and "statement_timeout=0 " in tuned["options"]
    bad = _hosted_database_settings(tmp_path, VERONICA_DB_LOCK_TIMEOUT="soon")
    assert bad.returncode != 0 and "VERONICA_DB_LOCK_TIMEOUT" in bad.stderr


def test_hosted_statements_are_prepared_unless_turned_off(tmp_path):
    """Server-side binding with prepared statements is the hosted default (a step skips parse and plan);
    0 turns it off for a transaction-mode pooler that cannot keep prepared statements."""
    import json

    options = json.loads(_hosted_database_settings(tmp_path).stdout)
    assert options["server_side_binding"] is True and options["prepare_threshold"] == 1, "prepared at a statement's second run"
    off = json.loads(_hosted_database_settings(tmp_path, VERONICA_DB_PREPARE_THRESHOLD="0").stdout)
    assert "server_side_binding" not in off and "prepare_threshold" not in off
    bad = _hosted_database_settings(tmp_path, VERONICA_DB_PREPARE_THRESHOLD="-1")
    assert bad.returncode != 0 and "VERONICA_DB_PREPARE_THRESHOLD" in bad.stderr


def test_a_transaction_pooler_gets_no_prepared_statements_startup_options_or_server_cursors(tmp_path):
    """PgBouncer in transaction mode (Debian's 1.18) refuses the `options` startup parameter, cannot keep
    prepared statements and hands each transaction its own server connection (issue 25.2)."""
    import json

    options = json.loads(_hosted_database_settings(tmp_path, VERONICA_DB_POOLER="transaction").stdout)
    assert "options" not in options and "server_side_binding" not in options and "prepare_threshold" not in options
    assert options["connect_timeout"] == 10, "client-side timeouts still apply"
    kept = json.loads(_hosted_database_settings(tmp_path, VERONICA_DB_POOLER="transaction", VERONICA_DB_PREPARE_THRESHOLD="5").stdout)
    assert kept["prepare_threshold"] == 5, "a pooler that keeps prepared statements (PgBouncer 1.21+) can have them back"
    cursors = _hosted_database_settings(tmp_path, "DISABLE_SERVER_SIDE_CURSORS", VERONICA_DB_POOLER="transaction")
    assert cursors.stdout.strip() == "true", cursors.stderr
    bad = _hosted_database_settings(tmp_path, VERONICA_DB_POOLER="session")
    assert bad.returncode != 0 and "VERONICA_DB_POOLER" in bad.stderr


@pytest.mark.parametrize("raw", ["0", "61", "fast"])
def test_engine_tick_period_is_validated_at_start_up(tmp_path, raw):
    result = _manage(["check"], VERONICA_ENGINE_TICK_SECONDS=raw, VERONICA_DATA_DIR=str(tmp_path))
    assert result.returncode != 0 and "VERONICA_ENGINE_TICK_SECONDS" in result.stderr


def test_every_variable_in_the_readme_configuration_table_is_read_by_the_code():
    import re

    documented = set()
    for line in (REPO / "README.md").read_text().splitlines():
        if line.startswith("| `"):
            documented |= set(re.findall(r"`(VERONICA_[A-Z0-9_]+)`", line.split(" | ")[0]))
    sources = [p for folder in ("veronica", "waggle", "learning", "bin") for p in (REPO / folder).rglob("*")
               if p.is_file() and p.suffix in ("", ".py", ".sh") and "migrations" not in p.parts]
    code = "\n".join(p.read_text(errors="ignore") for p in sources)
    assert len(documented) > 30
    assert sorted(name for name in documented if name not in code) == []
    # and every setting read from one is used beyond settings.py (a documented knob that turns nothing is a stub)
    settings_py = (REPO / "veronica" / "settings.py").read_text()
    elsewhere = "\n".join(p.read_text(errors="ignore") for p in sources if p.name != "settings.py")
    knobs = re.findall(r'^([A-Z_]+) = env_[a-z]+\("VERONICA_', settings_py, re.M)
    assert len(knobs) > 20
    from django.conf import global_settings

    # Django, axes and mozilla-django-oidc read theirs
    ours = [k for k in knobs if not hasattr(global_settings, k) and not k.startswith(("AXES_", "OIDC_"))]
    assert sorted(k for k in ours if not re.search(rf"\b{k}\b", elsewhere) and len(re.findall(rf"\b{k}\b", settings_py)) < 2) == []


@pytest.mark.parametrize("name, raw", [("VERONICA_SANDBOX_PROCS", "-1"), ("VERONICA_SANDBOX_MEMORY_MB", "lots"),
                                       ("VERONICA_SANDBOX_CPU_SECONDS", "1.5"), ("VERONICA_SANDBOX_FILE_MB", "-5"),
                                       ("VERONICA_SANDBOX_TMP_MB", "0")])
def test_sandbox_limits_are_validated_at_start_up(tmp_path, name, raw):
    result = _manage(["check"], **{name: raw, "VERONICA_DATA_DIR": str(tmp_path)})
    assert result.returncode != 0 and name in result.stderr


@pytest.mark.django_db
def test_a_hosted_statement_is_prepared_on_the_server_at_its_second_run():
    """A pool's connection parses and plans a statement shape once unprepared, then runs it prepared
    (psycopg's default of 5 unprepared runs made half of PostgreSQL's plans in bench/fleet.py)."""
    from django.conf import settings
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("server-side prepared statements are PostgreSQL's")
    if settings.DB_POOLER == "transaction":
        pytest.skip("through a transaction-mode pooler nothing is prepared (its default threshold is 0)")

    def prepared() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", ["SELECT $1::int + 41%"])
            return cursor.fetchone()[0]

    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::int + 41", [1])
        assert prepared() == 0
        cursor.execute("SELECT %s::int + 41", [1])
    assert prepared() == 1
