"""One settings module for every mode. The environment picks the mode:

* embedded default (no variables): SQLite (WAL, busy timeout, IMMEDIATE transactions), django-q2's
  ORM broker, an in-memory channel layer (sockets also poll the Event table, see veronica.web.consumers);
* hosted: DATABASE_URL (PostgreSQL) + REDIS_URL switch the database, channels-redis and django-q2's
  Redis broker. Nothing exists only in production.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from veronica.plumbing.env import (
    env_bool, env_choice, env_float, env_int, env_hosts, env_list, env_path, env_prices, env_str, env_url, private_dir, private_file,
)

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = private_dir(env_path("VERONICA_DATA_DIR", BASE_DIR / "data"))

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
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",  # intcomma: token counts with thousands separators in the console
    "channels",
    "veronica",  # before django_q: its `qcluster` command (with the engine ticker) overrides q2's
    "django_q",
    "waggle",
    "learning",
]
# daphne serves the console as its own process (`python -m daphne veronica.asgi:application`, what
# `manage.py up` and the README run); its app only swaps in an ASGI `runserver`, and importing it
# loads Twisted, autobahn and OpenSSL (~0.6 CPU-s) into every process, each qcluster worker host
# included, where a start-up at load 8 paid it in seconds. So it is listed for that command alone.
if sys.argv[1:2] == ["runserver"]:
    INSTALLED_APPS.insert(0, "daphne")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "veronica.swarm.audit.AuditMiddleware",  # who is acting, for the audit trail (veronica.swarm.audit)
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
            "builtins": ["django.contrib.humanize.templatetags.humanize"],  # |intcomma in every template
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
    # A host cut off from the database must neither hang nor freeze a space for everyone else:
    # libpq gives up connecting, and detects a dead peer (keepalives when idle, tcp_user_timeout
    # when data goes unacknowledged); the server ends statements and transactions that outstay
    # their time, so a partitioned worker's row locks are released. 0 turns any of them off.
    # Values in the URL's query string win over these.
    DB_CONNECT_TIMEOUT = env_int("VERONICA_DB_CONNECT_TIMEOUT", 10, minimum=0)
    DB_TCP_USER_TIMEOUT = env_int("VERONICA_DB_TCP_USER_TIMEOUT", 20, minimum=0)
    DB_KEEPALIVES_IDLE = env_int("VERONICA_DB_KEEPALIVES_IDLE", 10, minimum=1)
    DB_KEEPALIVES_INTERVAL = env_int("VERONICA_DB_KEEPALIVES_INTERVAL", 5, minimum=1)
    DB_KEEPALIVES_COUNT = env_int("VERONICA_DB_KEEPALIVES_COUNT", 3, minimum=1)
    DB_STATEMENT_TIMEOUT = env_int("VERONICA_DB_STATEMENT_TIMEOUT", 60, minimum=0)
    DB_IDLE_IN_TRANSACTION_TIMEOUT = env_int("VERONICA_DB_IDLE_IN_TRANSACTION_TIMEOUT", 15, minimum=0)
    DB_LOCK_TIMEOUT = env_int("VERONICA_DB_LOCK_TIMEOUT", 30, minimum=0)
    # The statements a step runs (its fence, its event statement, waggle's record) are prepared on the
    # server once a connection has run them this many times: parse and plan are skipped, a fifth of a
    # hosted step. 1 prepares a statement at its second run: every connection of a worker's pool (and
    # each new one, CONN_MAX_AGE) parsed and planned each statement shape 5 times at psycopg's default
    # of 5, half of the plans PostgreSQL made in bench/fleet.py (2,511 -> 1,267 in a run; the rest are
    # the plan cache's first custom plans). psycopg keeps at most 100 prepared per connection.
    # 0 turns prepared statements off (parameters are then bound client-side, Django's
    # default), for a transaction-mode pooler that cannot keep them (PgBouncer before 1.21).
    # VERONICA_DB_POOLER=transaction says DATABASE_URL is such a pooler (PgBouncer, pool_mode =
    # transaction): prepared statements default to off, no server-side cursors (a transaction's
    # server connection is not the next one's), and the server timeouts below are not sent as a
    # startup `options` parameter (PgBouncer refuses it): the pooler sets them on its server
    # connections (connect_query, see README's hosted section). The code keeps no session state
    # (no session SET, advisory lock, LISTEN or WITH HOLD cursor), so nothing else changes.
    DB_POOLER = env_choice("VERONICA_DB_POOLER", ("none", "transaction"), "none")
    DB_PREPARE_THRESHOLD = env_int("VERONICA_DB_PREPARE_THRESHOLD", 0 if DB_POOLER == "transaction" else 1, minimum=0)
    if DB_POOLER == "transaction":
        DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
    db_options = DATABASES["default"].setdefault("OPTIONS", {})
    if DB_PREPARE_THRESHOLD:
        db_options.setdefault("server_side_binding", True)
        db_options.setdefault("prepare_threshold", DB_PREPARE_THRESHOLD)
    for key, value in (("connect_timeout", DB_CONNECT_TIMEOUT), ("keepalives", 1), ("keepalives_idle", DB_KEEPALIVES_IDLE),
                       ("keepalives_interval", DB_KEEPALIVES_INTERVAL), ("keepalives_count", DB_KEEPALIVES_COUNT),
                       ("tcp_user_timeout", DB_TCP_USER_TIMEOUT * 1000)):
        db_options.setdefault(key, value)
    # lock_timeout above idle_in_transaction: a writer queued behind a dead session's lock waits
    # for the server to end that session and then succeeds, instead of failing first.
    DB_SERVER_SETTINGS = (f"statement_timeout={DB_STATEMENT_TIMEOUT * 1000}",
                          f"idle_in_transaction_session_timeout={DB_IDLE_IN_TRANSACTION_TIMEOUT * 1000}",
                          f"lock_timeout={DB_LOCK_TIMEOUT * 1000}")
    if DB_POOLER != "transaction":
        db_options["options"] = " ".join(filter(None, [db_options.get("options", ""), *(f"-c {s}" for s in DB_SERVER_SETTINGS)]))
else:
    # VERONICA_SQLITE_PATH lets a worker process join a given file (the engine tests point their
    # cluster at the test database this way).
    sqlite_path = env_path("VERONICA_SQLITE_PATH", DATA_DIR / "veronica.sqlite3")
    DATABASES = {
        "default": {
            "ENGINE": "veronica.plumbing.sqlite_serial",  # SQLite, its writers queued per process (see there)
            "NAME": private_file(sqlite_path) if sqlite_path.parent.is_dir() else sqlite_path,
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
            # Kept open between requests and tasks: django-q2's ORM broker and its workers call
            # close_old_connections() around every poll and task, which with 0 reopened the file
            # (and re-ran the PRAGMAs above) ten times a second and on every wake. 0 turns it off.
            "CONN_MAX_AGE": env_int("DB_CONN_MAX_AGE", 600, minimum=0),
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- redis: channel layer + django-q2 broker ---------------------------------------------------
REDIS_URL = env_url("REDIS_URL", ("redis", "rediss"))
if HOSTED and not REDIS_URL:
    raise ImproperlyConfigured("DATABASE_URL is set (hosted mode) but REDIS_URL is not; hosted mode needs both")

if REDIS_URL:
    # The event streams' doorbell (veronica.plumbing.redisbell) publishes under this prefix too.
    CHANNEL_PREFIX = env_str("VERONICA_CHANNEL_PREFIX", "veronica")
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # redis-py's default 5 s socket timeout equals channels-redis's blocking-read timeout, so an
            # idle receive would fail with "Timeout reading"; give the socket more room than the read.
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 15}],
                       "prefix": CHANNEL_PREFIX},
        }
    }
else:
    # Web server and workers are separate processes in the embedded default: an in-memory layer
    # would never carry a worker's event to a socket. The consumers treat the layer as a doorbell
    # only and poll the Event table as a backstop, see veronica.web.consumers.
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# --- django-q2 --------------------------------------------------------------------------------
# Chosen deliberately (DESIGN §3):
# * timeout: a run is bounded by its own lease and iteration limit; the q2 timeout is the hard stop.
# * retry > timeout: otherwise q2 re-delivers a task that is still running.
# * max_attempts=1 + ack_failures: a wake is a doorbell. A failed wake is never retried by q2;
#   the engine tick's sweep re-wakes any member with unread work, so nothing is lost.
# * catch_up off: after downtime the tick runs once, not once per missed minute.
# * time zone explicit (UTC) so cron schedules do not move with the host's zone.
# * queue_limit = 1, the least prefetch q2 allows (one queued; the default is workers²): a wake fetched
#   by a cluster whose workers are all busy waits behind their runs while another cluster idles, and a
#   SIGKILLed cluster takes what it fetched with it (the engine re-rings owed resumes every tick and the
#   sweep recovers mail, but each costs seconds). The pusher's hand holds what one fetch took: a burst
#   comes several wakes a fetch, the wakes at its head go up to 16 in one task, and a host whose
#   workers' run slots are all taken fetches none (veronica.engine.qbroker).
Q_TIMEOUT = env_int("VERONICA_Q_TIMEOUT", 900, minimum=10)
Q_WORKERS = env_int("VERONICA_Q_WORKERS", 4, minimum=1, maximum=64)
# Runs per worker process (veronica.engine.fleet): a worker claims a wake, hands the run to a thread
# of its own and takes the next wake while its runs wait on their models; a host runs up to
# VERONICA_Q_WORKERS x VERONICA_RUNS_PER_WORKER members at once. 1: a run holds its worker process
# for its whole length (the model before 2026). Hosted, each worker's runs share a pool of at most
# VERONICA_DB_POOL_SIZE PostgreSQL connections, taken only while a run writes (0: one per thread).
RUNS_PER_WORKER = env_int("VERONICA_RUNS_PER_WORKER", 32, minimum=1, maximum=1024)
DB_POOL_SIZE = env_int("VERONICA_DB_POOL_SIZE", 8, minimum=0, maximum=200)
Q_CLUSTER = {
    "name": env_str("VERONICA_Q_NAME", "veronica"),
    "workers": Q_WORKERS,
    "queue_limit": 1,
    "timeout": Q_TIMEOUT,
    "retry": Q_TIMEOUT + 60,
    "max_attempts": 1,
    "ack_failures": True,
    # A worker restarts after this many tasks (django-q2's recycle, a memory safety valve); a worker with
    # a run pool first finishes its runs (veronica.engine.fleet). bench/fleet.py sets it out of reach to
    # measure a long-lived worker's memory.
    "recycle": env_int("VERONICA_Q_RECYCLE", 500, minimum=1),
    "catch_up": False,
    "save_limit": 200,
    "poll": 0.1,
    "guard_cycle": 0.5,
    "label": "Django Q2",
    "time_zone": "UTC",
}
if REDIS_URL:
    Q_CLUSTER["redis"] = REDIS_URL
    Q_CLUSTER["broker_class"] = "veronica.engine.qbroker.GatedRedis"  # a host cut off from the database fetches no wakes
else:
    Q_CLUSTER["orm"] = "default"
    if env_bool("VERONICA_Q_DOORBELL", True):  # the ORM broker's pushers wait on the doorbell, not the poll
        Q_CLUSTER["broker_class"] = "veronica.engine.qbroker.DoorbellORM"

# --- outbound email (the ops notifier's email channel) ----------------------------------------
EMAIL_BACKEND = env_str("VERONICA_EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = env_str("VERONICA_EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("VERONICA_EMAIL_PORT", 25, minimum=1, maximum=65535)
EMAIL_HOST_USER = env_str("VERONICA_EMAIL_USER")
EMAIL_HOST_PASSWORD = env_str("VERONICA_EMAIL_PASSWORD")
EMAIL_USE_TLS = env_bool("VERONICA_EMAIL_TLS")
DEFAULT_FROM_EMAIL = env_str("VERONICA_EMAIL_FROM", "veronica@localhost")

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
# run_command is confined with bubblewrap ("bwrap"); "none" runs commands unconfined (opt-in).
COMMAND_SANDBOX = env_choice("VERONICA_COMMAND_SANDBOX", ("bwrap", "none"), "bwrap")
# Bounds on every sandboxed command (run_command, verify checks, MCP stdio servers); 0 turns one off.
# Processes: a pids cgroup (needed when the server runs as root, where RLIMIT_NPROC does not count),
# else RLIMIT_NPROC. Memory is address space per process; CPU seconds per process; file size per file.
SANDBOX_PROCS = env_int("VERONICA_SANDBOX_PROCS", 256, minimum=0, maximum=100_000)
SANDBOX_MEMORY_MB = env_int("VERONICA_SANDBOX_MEMORY_MB", 1024, minimum=0, maximum=1_048_576)
SANDBOX_CPU_SECONDS = env_int("VERONICA_SANDBOX_CPU_SECONDS", 600, minimum=0, maximum=86_400)
SANDBOX_FILE_MB = env_int("VERONICA_SANDBOX_FILE_MB", 256, minimum=0, maximum=1_048_576)
SANDBOX_TMP_MB = env_int("VERONICA_SANDBOX_TMP_MB", 256, minimum=1, maximum=1_048_576)
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
# The engine tick (lease expiry, cron, alarms, dispatch, watchdogs, sweep) runs this often in the one
# active ticker of the deployment; a dead worker's member runs again within its lease + about this.
ENGINE_TICK_SECONDS = env_int("VERONICA_ENGINE_TICK_SECONDS", 2, minimum=1, maximum=60)
# SIGTERM to a qcluster: q2 stops gracefully within this many seconds, or its process tree is killed.
Q_STOP_GRACE = env_int("VERONICA_Q_STOP_GRACE", 8, minimum=1, maximum=3600)

# Model calls through the vendors' SDKs (read when a run starts; bad values are refused here).
OPENAI_BASE_URL = env_url("OPENAI_BASE_URL", ("http", "https"))
ANTHROPIC_BASE_URL = env_url("ANTHROPIC_BASE_URL", ("http", "https"))
MODEL_TIMEOUT = env_float("VERONICA_MODEL_TIMEOUT", 120.0, minimum=1, maximum=3600)
MODEL_MAX_RETRIES = env_int("VERONICA_MODEL_MAX_RETRIES", 4, minimum=0, maximum=20)
MODEL_BACKOFF = env_float("VERONICA_MODEL_BACKOFF", 1.0, minimum=0, maximum=60)
MODEL_MAX_TOKENS = env_int("VERONICA_MODEL_MAX_TOKENS", 4096, minimum=1, maximum=1_000_000)
MODEL_STREAM = env_bool("VERONICA_MODEL_STREAM", True)
# A qcluster's workers make their model calls through one gateway process per host, which outlives them:
# a worker's death does not cost its runs' calls in flight (veronica.agent.providers.gateway).
MODEL_GATEWAY = env_bool("VERONICA_MODEL_GATEWAY", True)
# Each qcluster worker held to a CPU of its own, round-robin over the CPUs the cluster may use: a worker's
# many run threads then pass the GIL on one core (veronica.engine.cpupin). 0: the scheduler places them.
Q_PIN_WORKERS = env_bool("VERONICA_Q_PIN_WORKERS", True)
MODEL_PRICES = env_prices("VERONICA_MODEL_PRICES")
# Provider limits shared by every worker on every host (veronica.agent.providers.limits): concurrency,
# requests and tokens per minute, per endpoint and per model. Refused here, naming the table and field.
try:
    from veronica.agent.providers.limit_config import LimitConfigError, parse as _parse_limits

    PROVIDER_LIMITS = _parse_limits(os.environ.get("VERONICA_PROVIDER_LIMITS", ""))
except LimitConfigError as _exc:
    raise ImproperlyConfigured(str(_exc)) from None
# inbound webhook (veronica.ops.webhooks): largest body accepted, and how far a delivery's timestamp
# may be from the server's clock (also how long its signature is remembered against replays).
WEBHOOK_MAX_BYTES = env_int("VERONICA_WEBHOOK_MAX_BYTES", 65536, minimum=1024, maximum=10 * 1024 * 1024)
WEBHOOK_TOLERANCE_SECONDS = env_int("VERONICA_WEBHOOK_TOLERANCE_SECONDS", 300, minimum=10, maximum=3600)
# every request body (veronica.web.body_limit, in front of Django): over this, 413 before anything is
# spooled to disk. At least the archive upload (5 MB) and the webhook limit; views keep their own.
MAX_REQUEST_BYTES = env_int("VERONICA_MAX_REQUEST_BYTES", max(8 * 1024 * 1024, WEBHOOK_MAX_BYTES),
                            minimum=6 * 1024 * 1024, maximum=1024 ** 3)
if MAX_REQUEST_BYTES < WEBHOOK_MAX_BYTES:
    raise ImproperlyConfigured("VERONICA_MAX_REQUEST_BYTES must be at least VERONICA_WEBHOOK_MAX_BYTES")
# outbound notifier (veronica.ops.outbound): host names, IP addresses or CIDR networks the webhook and
# Slack URLs may reach although they are internal (loopback, private, link-local); empty = none.
NOTIFY_ALLOW_HOSTS = env_hosts("VERONICA_NOTIFY_ALLOW_HOSTS")
# MCP servers attached by URL (veronica.ops.outbound): the same rule. On the embedded default (one
# laptop, one operator) a local MCP server is the usual case, so loopback is allowed unless the
# variable says otherwise; hosted, where space owners are tenants, nothing internal by default.
# Set (even empty: nothing) it replaces that default.
MCP_ALLOW_HOSTS = (env_hosts("VERONICA_MCP_ALLOW_HOSTS") if "VERONICA_MCP_ALLOW_HOSTS" in os.environ
                   else [] if HOSTED else ["localhost", "127.0.0.0/8", "::1"])
# Remote A2A agents, like MCP servers: embedded reaches loopback (agents on this machine, another
# space of this deployment); hosted refuses internal addresses unless allowed here.
A2A_ALLOW_HOSTS = (env_hosts("VERONICA_A2A_ALLOW_HOSTS") if "VERONICA_A2A_ALLOW_HOSTS" in os.environ
                   else [] if HOSTED else ["localhost", "127.0.0.0/8", "::1"])
# An a2a__ call waits this long in the run; a remote task still going then parks the run (no worker
# held) and the engine tick polls it, waking the member when it ends (or its timeout passes).
A2A_INLINE_SECONDS = env_int("VERONICA_A2A_INLINE_SECONDS", 20, minimum=0, maximum=600)
A2A_MAX_BYTES = env_int("VERONICA_A2A_MAX_BYTES", 65536, minimum=1024, maximum=10 * 1024 * 1024)
# retention (veronica.engine.retention): the newest N events of a space are never purged (stream
# replay), and each kind is deleted in batches of this size (the tick does a few batches a call).
RETENTION_KEEP_EVENTS = env_int("VERONICA_RETENTION_KEEP_EVENTS", 1000, minimum=0)
RETENTION_EVERY_SECONDS = env_int("VERONICA_RETENTION_EVERY_SECONDS", 60, minimum=0, maximum=86400)
RETENTION_BATCH = env_int("VERONICA_RETENTION_BATCH", 500, minimum=1, maximum=100000)
# an ended session learning has not distilled yet is kept this many days past the window, then
# purged anyway (a distiller that is off or failing must not keep transcripts forever)
RETENTION_DISTILL_GRACE_DAYS = env_int("VERONICA_RETENTION_DISTILL_GRACE_DAYS", 7, minimum=0, maximum=3650)
# the audit trail keeps its own, longer window (days; 0 = keep every row); the retention duty purges it
AUDIT_RETENTION_DAYS = env_int("VERONICA_AUDIT_RETENTION_DAYS", 400, minimum=0, maximum=36500)
# member memory (veronica.swarm.memory): characters per file and per member, and files per member.
MEMORY_FILE_CHARS = env_int("VERONICA_MEMORY_FILE_CHARS", 16000, minimum=100)
MEMORY_TOTAL_CHARS = env_int("VERONICA_MEMORY_TOTAL_CHARS", 64000, minimum=100)
MEMORY_MAX_FILES = env_int("VERONICA_MEMORY_MAX_FILES", 40, minimum=1)

# waggle: mine in a django-q2 task so mining never slows a member's turn (tests and the in-process
# demo mine inline: VERONICA_WAGGLE_SWEEP_ASYNC=0).
WAGGLE = {"sweep_async": env_bool("VERONICA_WAGGLE_SWEEP_ASYNC", True)}

# learning: the host side is configured here so `learning` never imports `veronica`.
LEARNING_SOURCE = "veronica.swarm.learning_bridge.VeronicaSource"
LEARNING_COMPLETE = "veronica.agent.learning_model.make_complete"
LEARNING_AUTO_APPROVE = "veronica.swarm.learning_bridge.auto_approve"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    # every record's text (message, arguments, traceback) passes the secrets mask (veronica.plumbing.secret_store)
    "filters": {"mask_secrets": {"()": "veronica.plumbing.secret_store.MaskFilter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["mask_secrets"]}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"httpx2": {"level": "WARNING"}},  # the SDKs' HTTP client logs every request at INFO
}

# --- web hardening: login throttling, CSP, private caching, Permissions-Policy, socket re-checks ----
# django-axes throttles /login/ and /admin/login/ alike (both go through authenticate(request)):
# after VERONICA_LOGIN_FAILURE_LIMIT bad passwords for one username from one address, that pair is
# locked for VERONICA_LOGIN_COOLOFF_MINUTES (HTTP 429). Username + address, not the address alone:
# behind a proxy every client has the proxy's address. Attempts live in the database (both modes);
# staff unlock early with `manage.py axes_reset` or in the admin.
INSTALLED_APPS += ["axes", "csp"]
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "veronica.web.sso.LocalPasswordBackend", "veronica.web.sso.OidcBackend"]
AXES_FAILURE_LIMIT = env_int("VERONICA_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = env_int("VERONICA_LOGIN_COOLOFF_MINUTES", 15, minimum=1) / 60  # hours
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
# Behind N reverse proxies the client's address is N entries from the right of X-Forwarded-For
# (veronica.plumbing.web_headers.client_ip); 0 = not behind a proxy, the header is ignored.
TRUSTED_PROXY_COUNT = env_int("VERONICA_TRUSTED_PROXY_COUNT", 0, minimum=0, maximum=5)
AXES_CLIENT_IP_CALLABLE = "veronica.plumbing.web_headers.client_ip"
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_LOCKOUT_CALLABLE = "veronica.web.login.lockout_response"  # the same page, with Retry-After
# django-csp: scripts and styles only from our own files (no inline script, handler or style
# attribute anywhere in the console); the socket is same-origin, which CSP3's 'self' covers for ws(s).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}
MIDDLEWARE += [
    "csp.middleware.CSPMiddleware",
    "veronica.plumbing.web_headers.PrivateResponseHeaders",
    "veronica.web.sso.SessionRefresh",  # SSO sessions re-ask the IdP (prompt=none) when the ID token's time is up
    "axes.middleware.AxesMiddleware",  # last, as axes asks
]
# An open socket re-validates its token or session and its access this often (seconds).
VERONICA_STREAM_RECHECK_SECONDS = env_int("VERONICA_SOCKET_RECHECK_SECONDS", 5, minimum=1)
# axes logs every successful login's reset at INFO; its failures and lockouts are warnings
LOGGING["loggers"] = {**LOGGING.get("loggers", {}), "axes": {"level": "WARNING"}}

# --- single sign-on (veronica.web.sso, mozilla-django-oidc) -------------------------------------------------
# On when an issuer and a client id are set. The provider's endpoints come from its discovery
# document; the client is confidential and always uses PKCE (S256).
OIDC_ISSUER = env_url("VERONICA_OIDC_ISSUER", ("http", "https"))
OIDC_RP_CLIENT_ID = env_str("VERONICA_OIDC_CLIENT_ID")
OIDC_RP_CLIENT_SECRET = env_str("VERONICA_OIDC_CLIENT_SECRET")
OIDC_RP_SIGN_ALGO = env_choice("VERONICA_OIDC_SIGN_ALGO", ("RS256", "ES256", "PS256"), "RS256")
OIDC_RP_SCOPES = env_str("VERONICA_OIDC_SCOPES", "openid email profile")
OIDC_USE_PKCE = True
OIDC_PKCE_CODE_CHALLENGE_METHOD = "S256"
OIDC_TIMEOUT = env_int("VERONICA_OIDC_TIMEOUT", 10, minimum=1, maximum=120)
OIDC_STORE_ID_TOKEN = True  # the id_token_hint of the IdP logout
OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS = env_int("VERONICA_OIDC_RECHECK_SECONDS", 900, minimum=30)
OIDC_CREATE_USER = env_bool("VERONICA_OIDC_CREATE_USERS", True)
OIDC_AUTHENTICATE_CLASS = "veronica.web.sso.LoginStart"
OIDC_CALLBACK_CLASS = "veronica.web.sso.Callback"
OIDC_OP_LOGOUT_URL_METHOD = "veronica.web.sso.provider_logout_url"
LOGIN_REDIRECT_URL_FAILURE = "/login/?sso=failed"
# JSON and static requests are never redirected to the IdP (a script cannot follow a login page)
OIDC_EXEMPT_URLS = [__import__("re").compile(r"^/(api|static|metrics)(/|$)")]
# first login: link an existing user by verified e-mail ("email"), by username ("username"), or never ("none")
OIDC_MATCH = env_choice("VERONICA_OIDC_MATCH", ("email", "username", "none"), "email")
OIDC_USERNAME_CLAIM = env_str("VERONICA_OIDC_USERNAME_CLAIM", "preferred_username")
OIDC_GROUPS_CLAIM = env_str("VERONICA_OIDC_GROUPS_CLAIM", "groups")
OIDC_STAFF_GROUP = env_str("VERONICA_OIDC_STAFF_GROUP")


def _space_roles(items: list[str]) -> list[tuple[str, str, str]]:
    roles = []
    for item in items:
        group, sep, rest = item.partition("=")
        slug, sep2, role = rest.partition(":")
        if not (sep and sep2 and group.strip() and slug.strip()) or role.strip() not in ("viewer", "operator", "owner"):
            raise ImproperlyConfigured(f"VERONICA_OIDC_SPACE_ROLES item {item!r} must be GROUP=SPACE-SLUG:viewer|operator|owner")
        roles.append((group.strip(), slug.strip(), role.strip()))
    return roles


OIDC_SPACE_ROLES = _space_roles(env_list("VERONICA_OIDC_SPACE_ROLES"))
# 0: no password logs in (console or admin); SSO is the only door. Break glass by setting it back to 1.
LOCAL_PASSWORDS = env_bool("VERONICA_LOCAL_PASSWORDS", True)
if not LOCAL_PASSWORDS and not (OIDC_ISSUER and OIDC_RP_CLIENT_ID):
    raise ImproperlyConfigured("VERONICA_LOCAL_PASSWORDS=0 needs single sign-on (VERONICA_OIDC_ISSUER and VERONICA_OIDC_CLIENT_ID)")

# --- secrets (veronica.swarm.secrets) ----------------------------------------------------------------------------
# Comma-separated Fernet keys: the first encrypts, all decrypt (MultiFernet), so a new key goes in
# front, `manage.py rotate_secrets` re-encrypts every row under it, then the old key can go.
SECRETS_KEYS = env_list("VERONICA_SECRETS_KEY")
