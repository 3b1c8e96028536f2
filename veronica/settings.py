"""One settings module for every mode. The environment picks the mode:

* embedded default (no variables): SQLite (WAL, busy timeout, IMMEDIATE transactions), django-q2's
  ORM broker, an in-memory channel layer (sockets also poll the Event table, see veronica.consumers);
* hosted: DATABASE_URL (PostgreSQL) + REDIS_URL switch the database, channels-redis and django-q2's
  Redis broker. Nothing exists only in production.
"""
from __future__ import annotations

from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from veronica.env import env_bool, env_choice, env_float, env_int, env_list, env_path, env_prices, env_str, env_url

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = env_path("VERONICA_DATA_DIR", BASE_DIR / "data")
DATA_DIR.mkdir(parents=True, exist_ok=True)

DEBUG = env_bool("DEBUG", False)
SECRET_KEY = env_str("SECRET_KEY")
if not SECRET_KEY:
    # Embedded mode keeps a per-install random key in the data folder so sessions survive restarts.
    key_file = DATA_DIR / "secret_key"
    if not key_file.exists():
        from django.core.management.utils import get_random_secret_key

        key_file.write_text(get_random_secret_key())
        key_file.chmod(0o600)
    SECRET_KEY = key_file.read_text().strip()
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_q",
    "veronica",
    "waggle",
    "learning",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "veronica.urls"
ASGI_APPLICATION = "veronica.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- database -------------------------------------------------------------------------------
DATABASE_URL = env_url("DATABASE_URL", ("postgres", "postgresql", "sqlite"))
SQLITE_BUSY_TIMEOUT_MS = env_int("SQLITE_BUSY_TIMEOUT_MS", 20000, minimum=100)
HOSTED = bool(DATABASE_URL) and not DATABASE_URL.startswith("sqlite")

if HOSTED:
    # Persistent connections (with a health check) spare every wake task and request a new
    # PostgreSQL connection; 0 turns that off.
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=env_int("DB_CONN_MAX_AGE", 60, minimum=0),
                                                  conn_health_checks=True)}
    DATABASES["default"].setdefault("TEST", {})
else:
    # VERONICA_SQLITE_PATH lets a worker process join a given file (the engine tests point their
    # cluster at the test database this way).
    sqlite_path = env_path("VERONICA_SQLITE_PATH", DATA_DIR / "veronica.sqlite3")
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": sqlite_path,
            # IMMEDIATE: every transaction takes the write lock up front, so two writers never
            # deadlock on a read->write upgrade; the busy timeout makes them queue instead of fail.
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000,
                "init_command": (
                    "PRAGMA journal_mode=WAL;"
                    "PRAGMA synchronous=NORMAL;"
                    f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS};"
                ),
            },
            # A file (not :memory:) so worker processes in engine tests see the same database.
            "TEST": {"NAME": str(DATA_DIR / "test.sqlite3")},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- redis: channel layer + django-q2 broker ---------------------------------------------------
REDIS_URL = env_url("REDIS_URL", ("redis", "rediss"))
if HOSTED and not REDIS_URL:
    raise ImproperlyConfigured("DATABASE_URL is set (hosted mode) but REDIS_URL is not; hosted mode needs both")

if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # redis-py's default 5 s socket timeout equals channels-redis's blocking-read timeout, so an
            # idle receive would fail with "Timeout reading"; give the socket more room than the read.
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 15}],
                       "prefix": env_str("VERONICA_CHANNEL_PREFIX", "veronica")},
        }
    }
else:
    # Web server and workers are separate processes in the embedded default: an in-memory layer
    # would never carry a worker's event to a socket. The consumers treat the layer as a doorbell
    # only and poll the Event table as a backstop, see veronica.consumers.
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# --- django-q2 --------------------------------------------------------------------------------
# Chosen deliberately (DESIGN §3):
# * timeout: a run is bounded by its own lease and iteration limit; the q2 timeout is the hard stop.
# * retry > timeout: otherwise q2 re-delivers a task that is still running.
# * max_attempts=1 + ack_failures: a wake is a doorbell. A failed wake is never retried by q2;
#   the engine tick's sweep re-wakes any member with unread work, so nothing is lost.
# * catch_up off: after downtime the tick runs once, not once per missed minute.
# * time zone explicit (UTC) so cron schedules do not move with the host's zone.
Q_TIMEOUT = env_int("VERONICA_Q_TIMEOUT", 900, minimum=10)
Q_CLUSTER = {
    "name": env_str("VERONICA_Q_NAME", "veronica"),
    "workers": env_int("VERONICA_Q_WORKERS", 4, minimum=1, maximum=64),
    "timeout": Q_TIMEOUT,
    "retry": Q_TIMEOUT + 60,
    "max_attempts": 1,
    "ack_failures": True,
    "catch_up": False,
    "save_limit": 200,
    "poll": 0.1,
    "guard_cycle": 0.5,
    "label": "Django Q2",
    "time_zone": "UTC",
}
if REDIS_URL:
    Q_CLUSTER["redis"] = REDIS_URL
else:
    Q_CLUSTER["orm"] = "default"

# --- auth / i18n / static -----------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "staticfiles"

# --- security (hosted: set SECURE_SSL=1 behind TLS) ------------------------------------------------
SECURE_SSL = env_bool("SECURE_SSL", False)
SESSION_COOKIE_SECURE = SECURE_SSL
CSRF_COOKIE_SECURE = SECURE_SSL
SECURE_SSL_REDIRECT = SECURE_SSL
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000 if SECURE_SSL else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE_SSL
SECURE_HSTS_PRELOAD = SECURE_SSL
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if env_bool("BEHIND_PROXY", False) else None
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True

# --- veronica --------------------------------------------------------------------------------
WORKSPACES_DIR = env_path("VERONICA_WORKSPACES_DIR", DATA_DIR / "workspaces")
# run_command is confined with bubblewrap ("bwrap"); "none" runs commands unconfined (opt-in).
COMMAND_SANDBOX = env_choice("VERONICA_COMMAND_SANDBOX", ("bwrap", "none"), "bwrap")
# Simulated model latency for the offline provider (tests and benchmarks only; 0 in normal use).
OFFLINE_DELAY_MS = env_int("VERONICA_OFFLINE_DELAY_MS", 0, minimum=0, maximum=600000)
# A run renews its lease at every step, and every RUN_HEARTBEAT_SECONDS while a model call or a tool
# call (run_command: up to 30 s) is in flight; what renews nothing is the few DB writes between
# steps. The minimum lease is three heartbeats, so a live run never loses its slot to the watchdog.
RUN_HEARTBEAT_SECONDS = 1.0
RUN_LEASE_SECONDS = env_int("VERONICA_RUN_LEASE_SECONDS", 60, minimum=3)
# Failure model: a transient provider failure re-wakes the member after RETRY_BASE * 2^(n-1) seconds
# (capped at RETRY_MAX); a permanent one parks it until an operator resumes it or its config changes.
RUN_RETRY_BASE_SECONDS = env_int("VERONICA_RUN_RETRY_BASE_SECONDS", 15, minimum=1)
RUN_RETRY_MAX_SECONDS = env_int("VERONICA_RUN_RETRY_MAX_SECONDS", 900, minimum=1)
# Automatic compaction: when the next request would pass COMPACT_AT (percent) of the model's context
# window. Known windows per model below; VERONICA_CONTEXT_WINDOWS="model=tokens,..." adds or overrides
# (a model name or a prefix such as "gpt-4.1"; "offline" is the local policy, which has no real limit).
COMPACT_AT_PERCENT = env_int("VERONICA_COMPACT_AT_PERCENT", 80, minimum=10, maximum=100)
CONTEXT_WINDOWS = {
    "offline": 1_000_000, "gpt-4.1": 1_047_576, "gpt-4o": 128_000, "gpt-5": 400_000, "o3": 200_000, "o4-mini": 200_000,
    "claude-opus-4": 200_000, "claude-sonnet-4": 200_000, "claude-haiku-4-5": 200_000, "claude-3-5": 200_000,
}


def _context_windows(items: list[str]) -> dict[str, int]:
    windows = {}
    for item in items:
        name, sep, size = item.partition("=")
        if not sep or not name.strip() or not size.strip().isdigit() or int(size) < 1000:
            raise ImproperlyConfigured(f"VERONICA_CONTEXT_WINDOWS item {item!r} must be MODEL=TOKENS with TOKENS >= 1000")
        windows[name.strip()] = int(size)
    return windows


CONTEXT_WINDOWS.update(_context_windows(env_list("VERONICA_CONTEXT_WINDOWS")))
CONTEXT_WINDOW_DEFAULT = env_int("VERONICA_CONTEXT_WINDOW_DEFAULT", 128_000, minimum=1000)
ENGINE_TICK_SECONDS = env_int("VERONICA_ENGINE_TICK_SECONDS", 5, minimum=1)

# Model calls through the vendors' SDKs (read when a run starts; bad values are refused here).
OPENAI_BASE_URL = env_url("OPENAI_BASE_URL", ("http", "https"))
ANTHROPIC_BASE_URL = env_url("ANTHROPIC_BASE_URL", ("http", "https"))
MODEL_TIMEOUT = env_float("VERONICA_MODEL_TIMEOUT", 120.0, minimum=1, maximum=3600)
MODEL_MAX_RETRIES = env_int("VERONICA_MODEL_MAX_RETRIES", 4, minimum=0, maximum=20)
MODEL_BACKOFF = env_float("VERONICA_MODEL_BACKOFF", 1.0, minimum=0, maximum=60)
MODEL_MAX_TOKENS = env_int("VERONICA_MODEL_MAX_TOKENS", 4096, minimum=1, maximum=1_000_000)
MODEL_STREAM = env_bool("VERONICA_MODEL_STREAM", True)
MODEL_PRICES = env_prices("VERONICA_MODEL_PRICES")

# waggle: mine in a django-q2 task so mining never slows a member's turn (tests and the in-process
# demo mine inline: VERONICA_WAGGLE_SWEEP_ASYNC=0).
WAGGLE = {"sweep_async": env_bool("VERONICA_WAGGLE_SWEEP_ASYNC", True)}

# learning: the host side is configured here so `learning` never imports `veronica`.
LEARNING_SOURCE = "veronica.learning_bridge.VeronicaSource"
LEARNING_COMPLETE = "veronica.learning_bridge.make_complete"
LEARNING_AUTO_APPROVE = "veronica.learning_bridge.auto_approve"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"httpx2": {"level": "WARNING"}},  # the SDKs' HTTP client logs every request at INFO
}
