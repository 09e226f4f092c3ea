"""Settings for every profile, read from the environment.

Embedded default (nothing set): SQLite under ``OPENCLAW_STATE_DIR``, in-memory channel layer and
cache, tasks in the gateway process. Production: ``DATABASE_URL`` (PostgreSQL) and ``REDIS_URL``
(channel layer, cache, Celery broker) shared by several gateway processes.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import dj_database_url

from gateway import secret_files
from openclaw_site.env import (
    SettingsError,
    env_absolute_paths,
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_int_map,
    env_json_object,
    env_list,
    env_log_level,
    env_networks,
    env_str,
    env_url,
)
from openclaw_site.log_config import LOG_FORMATS, logging_config

BASE_DIR = Path(__file__).resolve().parent.parent
DATABASE_SCHEMES = ("sqlite", "postgres", "postgresql", "pgsql")
MODEL_PROVIDERS = ("echo", "openai")

STATE_DIR = Path(env_str("OPENCLAW_STATE_DIR", str(BASE_DIR / ".openclaw-state"))).resolve()
try:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
except OSError as error:
    raise SettingsError(f"OPENCLAW_STATE_DIR {STATE_DIR} cannot be created: {error.strerror}") from None

SECRET_KEY_FILE = STATE_DIR / "django-secret-key"
SECRET_KEY = (
    env_str("DJANGO_SECRET_KEY") or secret_files.read_or_create(SECRET_KEY_FILE, lambda: secrets.token_urlsafe(50))[0]
)

DEBUG = env_bool("DJANGO_DEBUG", False)
# Production: the host names clients use (comma-separated); behind a TLS-terminating proxy also set
# DJANGO_CSRF_TRUSTED_ORIGINS (https://host,...) and OPENCLAW_BEHIND_TLS_PROXY=1.
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS") or ["*"]
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS")
if env_bool("OPENCLAW_BEHIND_TLS_PROXY", False):
    # The proxy terminates TLS and says so in X-Forwarded-Proto (it must strip a client's own copy).
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True

INSTALLED_APPS = [
    "daphne",
    # The stock admin with rate-limited logins (openclaw_site/admin_site.py).
    "openclaw_site.admin_site.GatewayAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    # Listed so its API docs use the bundled Swagger UI files instead of a CDN.
    "ninja",
    # The project's own management commands (serve, bootstrap, cluster, gateway call).
    "openclaw_site",
    "gateway",
    "devices_app",
    "approvals_app",
    "sessions_app",
    "native_harness",
    "workers_app",
    "operations_app",
    "operator_ui",
]

MIDDLEWARE = [
    # First: every request gets its request_id (in each of its log lines) and one access line.
    "gateway.access_log.RequestLogMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files (the admin's CSS/JS, the API docs) from the gateway itself; async, so requests
    # under Daphne take no thread hop for it (WhiteNoise is sync-only).
    "servestatic.middleware.ServeStaticMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Under /api/, errors that no view answered (unknown routes, methods) get the API's error shape.
    "openclaw_site.api.ApiErrorShapeMiddleware",
]

ROOT_URLCONF = "openclaw_site.urls"
ASGI_APPLICATION = "openclaw_site.asgi.application"

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

# --- Database -------------------------------------------------------------------------------
DATABASE_URL = env_url("DATABASE_URL", f"sqlite:///{STATE_DIR / 'gateway.sqlite3'}", schemes=DATABASE_SCHEMES)
# The bundled native harness (threads, bindings) lives in a store of its own: SQLite under the
# state dir unless HARNESS_DATABASE_URL says otherwise.
HARNESS_DATABASE_URL = env_url(
    "HARNESS_DATABASE_URL", f"sqlite:///{STATE_DIR / 'harness.sqlite3'}", schemes=DATABASE_SCHEMES
)
# SQLite: seconds a connection is reused. PostgreSQL uses a pool instead (Django refuses both).
DB_CONN_MAX_AGE = env_int("DB_CONN_MAX_AGE", 300, minimum=0)
# PostgreSQL connections one process holds at most (each gateway process, each Celery worker): the
# ceiling that lets several processes share one server's max_connections.
DB_POOL_MAX_SIZE = env_int("OPENCLAW_DB_POOL_MAX_SIZE", 8, minimum=1, maximum=1000)
# How long a caller waits for a free PostgreSQL connection before its operation answers UNAVAILABLE (retryable).
# Nothing holds a connection while it waits on anything else (docs/architecture.md, "Waiting"), so every
# connection comes back within milliseconds unless the process is truly overloaded.
DB_POOL_TIMEOUT_MS = env_int("OPENCLAW_DB_POOL_TIMEOUT_MS", 3000, minimum=100, maximum=600_000)


def _database(url: str, sqlite_test_name: str) -> dict:
    database = dj_database_url.parse(url)
    database["CONN_HEALTH_CHECKS"] = True
    if database["ENGINE"] == "django.db.backends.sqlite3":
        database["CONN_MAX_AGE"] = DB_CONN_MAX_AGE
        # WAL lets the gateway read while a task writes; IMMEDIATE makes a write transaction take
        # the lock at BEGIN, so two writers queue instead of failing with "database is locked".
        database["OPTIONS"] = {
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
        # End-to-end tests start gateway processes that must open the test database too.
        database["TEST"] = {"NAME": str(STATE_DIR / sqlite_test_name)}
    else:
        # Connections go back to psycopg's pool at the end of each request, task and database hop
        # (Django runs each HTTP request's sync code in a thread of its own), so load cannot leave a
        # connection behind per thread. With CONN_HEALTH_CHECKS the pool pings a connection as it hands
        # it out: one the server dropped while idle is replaced before a caller's query.
        database["CONN_MAX_AGE"] = 0
        database["OPTIONS"] = {
            "pool": {
                "min_size": 1,
                "max_size": DB_POOL_MAX_SIZE,
                "timeout": DB_POOL_TIMEOUT_MS / 1000,
            },
            # Which process holds a connection, in pg_stat_activity.
            "application_name": f"openclaw-{os.getpid()}",
        }
    return database


DATABASES = {
    "default": _database(DATABASE_URL, "test-gateway.sqlite3"),
    "harness": _database(HARNESS_DATABASE_URL, "test-harness.sqlite3"),
}
DATABASE_ROUTERS = ["openclaw_site.db_routers.HarnessRouter"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis: channel layer, cache, Celery broker ---------------------------------------------
REDIS_URL = env_url("REDIS_URL", schemes=("redis", "rediss", "unix"))
# Isolates concurrent test runs and deployments that share one Redis.
REDIS_PREFIX = env_str("OPENCLAW_REDIS_PREFIX", "openclaw")

if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            # channels_redis as shipped. Not its pub/sub layer: that one drops what reaches a channel whose receive
            # was cancelled (invoke.py's reply wait times out and receives again) and has no capacity
            # (docs/architecture.md, "The gateway core"; the measured trade in bench/README.md, 2026-12-04).
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                # channels_redis blocks in BRPOP for 5 s; redis-py 8 gives up reading after 5 s by
                # default, which killed idle consumers (close 1011). Wait longer than the BRPOP.
                # redis-py's pool holds 100 connections by default and refuses the 101st call at once
                # (MaxConnectionsError); a burst of disconnects (each leaving its groups) exceeded it.
                "hosts": [{"address": REDIS_URL, "socket_timeout": 15, "max_connections": 1000}],
                "prefix": f"{REDIS_PREFIX}:asgi",
                "capacity": 1000,
            },
        }
    }
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": REDIS_PREFIX,
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer", "CONFIG": {"capacity": 1000}}}
    # An OpenClaw node's workspace download keeps an entry per file for its duration (up to the manifest's
    # 50,000 files); Django's default of 300 entries would cull a transfer's own files while the node pulls them.
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "OPTIONS": {"MAX_ENTRIES": 1_000_000},
        }
    }

# Where long work (model turns, sweeps) runs: Celery workers when Redis is configured, else a thread
# pool inside the gateway process. OPENCLAW_TASK_MODE overrides ("celery" | "inprocess").
OPENCLAW_TASK_MODE = env_choice("OPENCLAW_TASK_MODE", "celery" if REDIS_URL else "inprocess", ("celery", "inprocess"))
if OPENCLAW_TASK_MODE == "celery" and not REDIS_URL:
    raise SettingsError("OPENCLAW_TASK_MODE=celery needs REDIS_URL (the Celery broker)")
# In-process tasks: the gateway's threads for them. A turn holds one while it waits on its model, its tools or an
# operator's approval; tasks beyond this many wait for a thread.
OPENCLAW_TASK_THREADS = env_int("OPENCLAW_TASK_THREADS", 32, minimum=1, maximum=1024)
# Each gateway process's threads for long work of requests (a node's removal, dispatches and moves, workspace
# transfers, the model calls of node turns): they wait on nodes, providers and models, not on the CPU.
OPENCLAW_WORK_THREADS = env_int("OPENCLAW_WORK_THREADS", 64, minimum=4, maximum=1024)

# The broker: Redis (REDIS_URL) unless CELERY_BROKER_URL names another; the spec allows RabbitMQ
# (amqp://user:password@host:5672/vhost). The channel layer and the cache stay on Redis either way.
CELERY_BROKER_URL = (
    env_url("CELERY_BROKER_URL", schemes=("redis", "rediss", "amqp", "amqps")) or REDIS_URL or "memory://"
)
if CELERY_BROKER_URL.startswith(("redis", "unix")):
    # Deployments (and concurrent test runs) sharing one Redis must not take each other's tasks.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"global_keyprefix": f"{REDIS_PREFIX}:celery:"}
CELERY_TASK_DEFAULT_QUEUE = env_str("OPENCLAW_CELERY_QUEUE", "openclaw")
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_SOFT_TIME_LIMIT = 300
CELERY_TASK_TIME_LIMIT = 360
CELERY_TASK_IGNORE_RESULT = True
CELERY_BEAT_SCHEDULE = {
    # Every 30 s: forget connections of dead gateway processes.
    "gateway-sweep": {"task": "gateway.sweep", "schedule": 30.0},
    # Every 30 s: expire pending pairing requests (their approval window is 5 minutes).
    "devices-pairing-sweep": {"task": "devices.pairing_sweep", "schedule": 30.0},
    # Every 15 s: fail turns whose worker stopped heartbeating, restart queued turns nobody took.
    "sessions-sweep": {"task": "sessions.runs_sweep", "schedule": 15.0},
    # Every 15 s: reconcile worker environments with their providers, fail placements whose worker vanished.
    "workers-recovery-sweep": {"task": "workers.recovery_sweep", "schedule": 15.0},
    # Every 15 s: expire exec approvals nobody decided in time (their waiters also expire them on the spot).
    "approvals-expire-sweep": {"task": "approvals.expire_sweep", "schedule": 15.0},
}

# --- Metrics (docs/operations.md) ------------------------------------------------------------
# Off: the instruments record nothing and /metrics answers 404 (the benchmark measures both).
OPENCLAW_METRICS_ENABLED = env_bool("OPENCLAW_METRICS_ENABLED", True)
# Set: /metrics asks every client for `Authorization: Bearer <token>`, loopback included. Unset: loopback only.
OPENCLAW_METRICS_TOKEN = env_str("OPENCLAW_METRICS_TOKEN")

# --- Gateway --------------------------------------------------------------------------------
OPENCLAW_GATEWAY = {
    "BIND": env_str("OPENCLAW_GATEWAY_BIND", "127.0.0.1"),
    "PORT": env_int("OPENCLAW_GATEWAY_PORT", 18789, minimum=0, maximum=65535),
    # Unset: read from (or generated into) STATE_DIR/gateway-token by `manage.py bootstrap`/`serve`.
    "TOKEN": env_str("OPENCLAW_GATEWAY_TOKEN"),
    "PASSWORD": env_str("OPENCLAW_GATEWAY_PASSWORD"),
    "HANDSHAKE_TIMEOUT_MS": env_int("OPENCLAW_HANDSHAKE_TIMEOUT_MS", 10_000, minimum=100),
    # A node's connect refused for a pending pairing is answered after at most this long, at once when an operator
    # approves it meanwhile (gateway/pairing_wait.py); below the 15 s OpenClaw's clients wait for the answer.
    "PAIRING_HOLD_MS": env_int("OPENCLAW_PAIRING_HOLD_MS", 8_000, minimum=0, maximum=12_000),
    "TICK_INTERVAL_MS": env_int("OPENCLAW_TICK_INTERVAL_MS", 30_000, minimum=100),
    # Embedded profile: how often the gateway loop runs the recovery sweeps (production: Celery beat).
    "SWEEP_INTERVAL_MS": env_int("OPENCLAW_SWEEP_INTERVAL_MS", 15_000, minimum=1000),
    "MAX_PAYLOAD_BYTES": env_int("OPENCLAW_MAX_PAYLOAD_BYTES", 25 * 1024 * 1024, minimum=64 * 1024),
    "MAX_BUFFERED_BYTES": env_int("OPENCLAW_MAX_BUFFERED_BYTES", 50 * 1024 * 1024, minimum=64 * 1024),
    "MAX_PREAUTH_PAYLOAD_BYTES": 64 * 1024,
    # Slow request heads (docs/deployment.md, "Slow clients"): a request line and headers must arrive within this
    # long, from accept for a connection's first request and from the end of the previous response for the next.
    "HTTP_HEAD_TIMEOUT_MS": env_int("OPENCLAW_HTTP_HEAD_TIMEOUT_MS", 10_000, minimum=100, maximum=600_000),
    # First request heads still incomplete a second after accept that one client address may hold; past it
    # that address is answered 429 until one of them ends. Addresses in the exempt list are not counted.
    "HTTP_SLOW_HEADS_PER_ADDRESS": env_int("OPENCLAW_HTTP_SLOW_HEADS_PER_ADDRESS", 32, minimum=1),
    "HTTP_SLOW_HEADS_EXEMPT": env_networks("OPENCLAW_HTTP_SLOW_HEADS_EXEMPT"),
    "NODE_INVOKE_TIMEOUT_MS": env_int("OPENCLAW_NODE_INVOKE_TIMEOUT_MS", 30_000, minimum=1),
    # agent.wait sleeps on the run-finished notification and re-reads the run at least this often.
    "AGENT_WAIT_RECHECK_MS": env_int("OPENCLAW_AGENT_WAIT_RECHECK_MS", 5_000, minimum=10),
    "DEVICE_SIGNATURE_SKEW_MS": 2 * 60 * 1000,
    "PAIRING_PENDING_TTL_MS": 5 * 60 * 1000,
    "AUTH_RATE_LIMIT": {
        "MAX_FAILURES": env_int("OPENCLAW_AUTH_RATE_LIMIT_MAX_FAILURES", 10, minimum=1),
        "WINDOW_MS": env_int("OPENCLAW_AUTH_RATE_LIMIT_WINDOW_MS", 60_000, minimum=1),
        "LOCKOUT_MS": env_int("OPENCLAW_AUTH_RATE_LIMIT_LOCKOUT_MS", 300_000, minimum=0),
        # OpenClaw exempts loopback clients; tests switch the exemption off to exercise the limiter.
        "EXEMPT_LOOPBACK": env_bool("OPENCLAW_AUTH_RATE_LIMIT_EXEMPT_LOOPBACK", True),
    },
    # A gateway process that has not refreshed its heartbeat for this long is considered dead,
    # and the connections it registered are no longer routable.
    "PROCESS_HEARTBEAT_INTERVAL_MS": env_int("OPENCLAW_PROCESS_HEARTBEAT_INTERVAL_MS", 10_000, minimum=100),
    "PROCESS_STALE_AFTER_MS": env_int("OPENCLAW_PROCESS_STALE_AFTER_MS", 35_000, minimum=100),
    # Each Celery worker process renews a lease in the cache this often; one not renewed for EXECUTOR_LEASE_TTL_MS
    # (whole seconds: the cache's expiry) is a stopped worker, and the gateway loop, which looks every
    # EXECUTOR_WATCH_INTERVAL_MS, fails its running turns: a killed worker's turns end within TTL + interval.
    "EXECUTOR_LEASE_RENEW_MS": env_int("OPENCLAW_EXECUTOR_LEASE_RENEW_MS", 1_000, minimum=100),
    "EXECUTOR_LEASE_TTL_MS": env_int("OPENCLAW_EXECUTOR_LEASE_TTL_MS", 5_000, minimum=1_000),
    "EXECUTOR_WATCH_INTERVAL_MS": env_int("OPENCLAW_EXECUTOR_WATCH_INTERVAL_MS", 1_000, minimum=100),
    # Celery task mode: a queued turn that no worker has taken this long, while no worker consumes the turn queue
    # (gateway/task_consumers.py), fails with the reason "worker-missing"; 0 leaves it queued (the warnings stay).
    "TURN_PICKUP_TIMEOUT_S": env_int("OPENCLAW_TURN_PICKUP_TIMEOUT_S", 90, minimum=0),
    # Right after a start, operators' reads (RPC, JSON API, console, admin) wait for startup recovery to have
    # reconciled the placements, at most this long; then they are answered UNAVAILABLE (retryable).
    "STARTUP_READ_WAIT_MS": env_int("OPENCLAW_STARTUP_READ_WAIT_MS", 30_000, minimum=0),
}
# HTTP bodies are bounded like WebSocket frames (a worker's inference request carries a turn's history).
DATA_UPLOAD_MAX_MEMORY_SIZE = OPENCLAW_GATEWAY["MAX_PAYLOAD_BYTES"]
if OPENCLAW_GATEWAY["PROCESS_STALE_AFTER_MS"] <= OPENCLAW_GATEWAY["PROCESS_HEARTBEAT_INTERVAL_MS"]:
    raise SettingsError(
        "OPENCLAW_PROCESS_STALE_AFTER_MS must be longer than OPENCLAW_PROCESS_HEARTBEAT_INTERVAL_MS "
        "(a live process would be declared dead between two heartbeats)"
    )
if OPENCLAW_GATEWAY["EXECUTOR_LEASE_TTL_MS"] < 2 * OPENCLAW_GATEWAY["EXECUTOR_LEASE_RENEW_MS"]:
    raise SettingsError(
        "OPENCLAW_EXECUTOR_LEASE_TTL_MS must be at least twice OPENCLAW_EXECUTOR_LEASE_RENEW_MS "
        "(one late renewal would declare a live worker stopped)"
    )

# --- Exec approvals -----------------------------------------------------------------------------
# How long an exec approval waits for an operator when the asker gives no timeoutMs (OpenClaw's
# DEFAULT_EXEC_APPROVAL_TIMEOUT_MS, 30 minutes); then askFallback decides (docs/exec-approvals.md).
OPENCLAW_EXEC_APPROVAL_TIMEOUT_MS = env_int(
    "OPENCLAW_EXEC_APPROVAL_TIMEOUT_MS", 1_800_000, minimum=1000, maximum=24 * 60 * 60 * 1000
)

# --- Session workspaces -------------------------------------------------------------------------
# Directories (besides <state dir>/workspace) whose git checkouts sessions.create may make worktrees
# of (``cwd``); os.pathsep-separated absolute paths. Unset: only the agent workspace.
OPENCLAW_WORKSPACE_ROOTS = env_absolute_paths("OPENCLAW_WORKSPACE_ROOTS")

# --- Worker profiles ---------------------------------------------------------------------------
# Where sessions.dispatch may place a session: {"<profile id>": {"provider": "static-ssh",
# "install": "bundle"|"local", "settings": {…}}}. Checked against the registered providers when
# workers_app starts (workers_app.profiles); unset: no profiles, dispatch refuses profile targets.
OPENCLAW_WORKER_PROFILES = env_json_object("OPENCLAW_WORKER_PROFILES")
OPENCLAW_WORKERS = {
    # A provider call (provision, inspect, destroy) that takes longer is abandoned as a transient failure.
    "PROVIDER_TIMEOUT_MS": env_int("OPENCLAW_WORKER_PROVIDER_TIMEOUT_MS", 30_000, minimum=100),
    # A dispatch or move stage whose driver went silent this long is failed by recovery.
    "STAGE_DEADLINE_MS": env_int("OPENCLAW_WORKER_STAGE_DEADLINE_MS", 600_000, minimum=1000),
    # How long sessions.dispatch waits for the placement to become active (or fail) before answering.
    "DISPATCH_WAIT_MS": env_int("OPENCLAW_WORKER_DISPATCH_WAIT_MS", 120_000, minimum=100),
    # Where node hosts this gateway starts (the local and static-ssh providers) connect to; unset:
    # ws://<bind address, loopback for a wildcard>:<port>.
    "GATEWAY_URL": env_url("OPENCLAW_WORKER_GATEWAY_URL", schemes=("ws", "wss")).rstrip("/"),
}

# --- Model provider ---------------------------------------------------------------------------
# No base URL: the built-in deterministic "echo" provider. A base URL: an OpenAI-compatible
# endpoint streamed with POST {BASE_URL}/chat/completions.
_MODEL_BASE_URL = env_url("OPENCLAW_MODEL_BASE_URL", schemes=("http", "https")).rstrip("/")
OPENCLAW_MODEL = {
    "PROVIDER": env_choice("OPENCLAW_MODEL_PROVIDER", "openai" if _MODEL_BASE_URL else "echo", MODEL_PROVIDERS),
    "BASE_URL": _MODEL_BASE_URL,
    "API_KEY": env_str("OPENCLAW_MODEL_API_KEY"),
    "MODEL": env_str("OPENCLAW_MODEL", "echo"),
    "CONNECT_TIMEOUT_S": env_float("OPENCLAW_MODEL_CONNECT_TIMEOUT_S", 10, minimum=0.1),
    # Longest silence allowed between two streamed chunks (or before a non-streamed reply).
    "READ_TIMEOUT_S": env_float("OPENCLAW_MODEL_READ_TIMEOUT_S", 60, minimum=0.1),
    # Whole turn, start to last byte.
    "TOTAL_TIMEOUT_S": env_float("OPENCLAW_MODEL_TOTAL_TIMEOUT_S", 600, minimum=0.1),
    # The model sees at most this many of the newest transcript messages.
    "CONTEXT_MESSAGES": env_int("OPENCLAW_MODEL_CONTEXT_MESSAGES", 200, minimum=1),
}
if OPENCLAW_MODEL["PROVIDER"] == "openai" and not _MODEL_BASE_URL:
    raise SettingsError("OPENCLAW_MODEL_PROVIDER=openai needs OPENCLAW_MODEL_BASE_URL")

# --- Usage ------------------------------------------------------------------------------------
# USD per million tokens of each model: {"<model>" or "<provider>/<model>": {"input", "output", "cacheRead"?,
# "cacheWrite"?}}; checked when operations_app starts. A model without a price costs 0 in the usage reports,
# which list it as unpriced (docs/operations.md "Usage").
OPENCLAW_MODEL_PRICES = env_json_object("OPENCLAW_MODEL_PRICES")

# --- Agent turns ------------------------------------------------------------------------------
# A turn is an agent loop: model → tool calls → results → model … (docs/agent-tools.md).
OPENCLAW_AGENT = {
    # Model calls one turn may make before it ends with an error (each answer with tool calls is a step);
    # OPENCLAW_AGENT_MAX_STEPS_BY_AGENT ({"<agentId>": n}) sets it per agent.
    "MAX_STEPS": env_int("OPENCLAW_AGENT_MAX_STEPS", 24, minimum=1, maximum=1000),
    "MAX_STEPS_BY_AGENT": env_int_map("OPENCLAW_AGENT_MAX_STEPS_BY_AGENT", minimum=1, maximum=1000),
    # The whole turn: its model calls, tools and approval waits (the turn tasks' soft time limit).
    "TURN_TIMEOUT_S": env_int("OPENCLAW_TURN_TIMEOUT_S", 3600, minimum=10),
    # exec: a command's default and longest wall-clock time, and how many run at once on one host.
    "EXEC_TIMEOUT_S": env_float("OPENCLAW_TOOLS_EXEC_TIMEOUT_S", 120, minimum=1),
    "EXEC_MAX_TIMEOUT_S": env_float("OPENCLAW_TOOLS_EXEC_MAX_TIMEOUT_S", 1800, minimum=1),
    "EXEC_CONCURRENCY": env_int("OPENCLAW_TOOLS_EXEC_CONCURRENCY", 4, minimum=1, maximum=256),
}
if OPENCLAW_AGENT["EXEC_TIMEOUT_S"] > OPENCLAW_AGENT["EXEC_MAX_TIMEOUT_S"]:
    raise SettingsError("OPENCLAW_TOOLS_EXEC_TIMEOUT_S must not exceed OPENCLAW_TOOLS_EXEC_MAX_TIMEOUT_S")
if OPENCLAW_EXEC_APPROVAL_TIMEOUT_MS >= OPENCLAW_AGENT["TURN_TIMEOUT_S"] * 1000:
    # A turn waiting for a decision would be killed by its own time limit before the approval expires.
    raise SettingsError("OPENCLAW_EXEC_APPROVAL_TIMEOUT_MS must be shorter than OPENCLAW_TURN_TIMEOUT_S")

# --- Misc -----------------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
LOGIN_URL = "ui:login"
LOGIN_REDIRECT_URL = "ui:home"
STATIC_URL = "static/"
STATIC_ROOT = STATE_DIR / "static"
# Served from the apps' static folders (no collectstatic step): the admin's, ninja's and ours.
SERVESTATIC_USE_FINDERS = True
SERVESTATIC_AUTOREFRESH = DEBUG

# --- Logs (docs/operations.md, "Logs") ------------------------------------------------------------
# The console's format: "plain" (the human one, the embedded default) or "json" (one object per line; `manage.py
# cluster` sets it for its programs unless it is set). The file always gets JSON lines; OPENCLAW_LOG_FILE="" (set
# and empty) disables it. Every process of a state directory may share the file (gateway/log_files.py).
OPENCLAW_LOG_FORMAT = env_choice("OPENCLAW_LOG_FORMAT", "plain", LOG_FORMATS)
_LOG_FILE = env_str("OPENCLAW_LOG_FILE", str(STATE_DIR / "logs" / "gateway.log"))
OPENCLAW_LOG_FILE = None if os.environ.get("OPENCLAW_LOG_FILE") == "" else Path(_LOG_FILE).resolve()
OPENCLAW_LOG_FILE_MAX_BYTES = env_int("OPENCLAW_LOG_FILE_MAX_BYTES", 10 * 1024 * 1024, minimum=64 * 1024)
OPENCLAW_LOG_FILE_BACKUPS = env_int("OPENCLAW_LOG_FILE_BACKUPS", 5, minimum=0, maximum=100)
if OPENCLAW_LOG_FILE is not None:
    try:
        OPENCLAW_LOG_FILE.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise SettingsError(
            f"OPENCLAW_LOG_FILE's directory {OPENCLAW_LOG_FILE.parent} cannot be created: {error.strerror}"
        ) from None
LOGGING = logging_config(
    console_format=OPENCLAW_LOG_FORMAT,
    level=env_log_level("OPENCLAW_LOG_LEVEL", "INFO"),
    file_path=OPENCLAW_LOG_FILE,
    file_max_bytes=OPENCLAW_LOG_FILE_MAX_BYTES,
    file_backups=OPENCLAW_LOG_FILE_BACKUPS,
    # Celery's lines about each periodic sweep (every 15 s) go to DEBUG; each sweep logs what it changed.
    routine_tasks=[entry["task"] for entry in CELERY_BEAT_SCHEDULE.values()],
)
# Celery workers keep this configuration instead of replacing the root logger's handlers with their own.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
