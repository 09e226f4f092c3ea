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

BASE_DIR = Path(__file__).resolve().parent.parent


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw else default


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    return raw in {"1", "true", "yes", "on"}


STATE_DIR = Path(os.environ.get("OPENCLAW_STATE_DIR", BASE_DIR / ".openclaw-state")).resolve()
STATE_DIR.mkdir(parents=True, exist_ok=True)

SECRET_KEY_FILE = STATE_DIR / "django-secret-key"
if os.environ.get("DJANGO_SECRET_KEY"):
    SECRET_KEY = os.environ["DJANGO_SECRET_KEY"]
else:
    if not SECRET_KEY_FILE.exists():
        fd = os.open(SECRET_KEY_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(50))
    SECRET_KEY = SECRET_KEY_FILE.read_text().strip()

DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = [h for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "*").split(",") if h]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "openclaw_site.gateway",
    "sessions_app",
    "native_harness",
    "workers_app",
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
DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{STATE_DIR / 'gateway.sqlite3'}"
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=env_int("DB_CONN_MAX_AGE", 300))}
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets the gateway read while a task writes; IMMEDIATE makes a write transaction take
    # the lock at BEGIN, so two writers queue instead of failing with "database is locked".
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # End-to-end tests start gateway processes that must open the test database too.
    DATABASES["default"]["TEST"] = {"NAME": str(STATE_DIR / "test-gateway.sqlite3")}
# The bundled native harness (threads, bindings) lives in a store of its own: SQLite under the
# state dir unless HARNESS_DATABASE_URL says otherwise.
HARNESS_DATABASE_URL = os.environ.get("HARNESS_DATABASE_URL") or f"sqlite:///{STATE_DIR / 'harness.sqlite3'}"
DATABASES["harness"] = dj_database_url.parse(HARNESS_DATABASE_URL, conn_max_age=env_int("DB_CONN_MAX_AGE", 300))
if DATABASES["harness"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["harness"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    DATABASES["harness"]["TEST"] = {"NAME": str(STATE_DIR / "test-harness.sqlite3")}
DATABASE_ROUTERS = ["openclaw_site.db_routers.HarnessRouter"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis: channel layer, cache, Celery broker ---------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "").strip()
# Isolates concurrent test runs and deployments that share one Redis.
REDIS_PREFIX = os.environ.get("OPENCLAW_REDIS_PREFIX", "openclaw")

if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                # channels_redis blocks in BRPOP for 5 s; redis-py 8 gives up reading after 5 s by
                # default, which killed idle consumers (close 1011). Wait longer than the BRPOP.
                "hosts": [{"address": REDIS_URL, "socket_timeout": 15}],
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
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# Where long work (model turns, sweeps) runs: Celery workers when Redis is configured, else a thread
# pool inside the gateway process. OPENCLAW_TASK_MODE overrides ("celery" | "inprocess").
OPENCLAW_TASK_MODE = os.environ.get("OPENCLAW_TASK_MODE", "").strip() or ("celery" if REDIS_URL else "inprocess")

CELERY_BROKER_URL = REDIS_URL or "memory://"
# Deployments (and concurrent test runs) sharing one Redis must not take each other's tasks.
CELERY_BROKER_TRANSPORT_OPTIONS = {"global_keyprefix": f"{REDIS_PREFIX}:celery:"}
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("OPENCLAW_CELERY_QUEUE", "openclaw")
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_SOFT_TIME_LIMIT = 300
CELERY_TASK_TIME_LIMIT = 360
CELERY_TASK_IGNORE_RESULT = True
CELERY_BEAT_SCHEDULE = {
    # Every 30 s: expire pending pairing requests and forget connections of dead gateway processes.
    "gateway-sweep": {"task": "gateway.sweep", "schedule": 30.0},
    # Every 15 s: fail turns whose worker stopped heartbeating, restart queued turns nobody took.
    "sessions-sweep": {"task": "sessions.runs_sweep", "schedule": 15.0},
}

# --- Gateway --------------------------------------------------------------------------------
OPENCLAW_GATEWAY = {
    "BIND": os.environ.get("OPENCLAW_GATEWAY_BIND", "127.0.0.1"),
    "PORT": env_int("OPENCLAW_GATEWAY_PORT", 18789),
    # Unset: read from (or generated into) STATE_DIR/gateway-token by `manage.py bootstrap`/`serve`.
    "TOKEN": os.environ.get("OPENCLAW_GATEWAY_TOKEN", "").strip(),
    "PASSWORD": os.environ.get("OPENCLAW_GATEWAY_PASSWORD", "").strip(),
    "HANDSHAKE_TIMEOUT_MS": env_int("OPENCLAW_HANDSHAKE_TIMEOUT_MS", 10_000),
    "TICK_INTERVAL_MS": env_int("OPENCLAW_TICK_INTERVAL_MS", 30_000),
    "MAX_PAYLOAD_BYTES": env_int("OPENCLAW_MAX_PAYLOAD_BYTES", 25 * 1024 * 1024),
    "MAX_BUFFERED_BYTES": env_int("OPENCLAW_MAX_BUFFERED_BYTES", 50 * 1024 * 1024),
    "MAX_PREAUTH_PAYLOAD_BYTES": 64 * 1024,
    "NODE_INVOKE_TIMEOUT_MS": env_int("OPENCLAW_NODE_INVOKE_TIMEOUT_MS", 30_000),
    "DEVICE_SIGNATURE_SKEW_MS": 2 * 60 * 1000,
    "PAIRING_PENDING_TTL_MS": 5 * 60 * 1000,
    "AUTH_RATE_LIMIT": {
        "MAX_FAILURES": env_int("OPENCLAW_AUTH_RATE_LIMIT_MAX_FAILURES", 10),
        "WINDOW_MS": env_int("OPENCLAW_AUTH_RATE_LIMIT_WINDOW_MS", 60_000),
        "LOCKOUT_MS": env_int("OPENCLAW_AUTH_RATE_LIMIT_LOCKOUT_MS", 300_000),
        # OpenClaw exempts loopback clients; tests switch the exemption off to exercise the limiter.
        "EXEMPT_LOOPBACK": env_bool("OPENCLAW_AUTH_RATE_LIMIT_EXEMPT_LOOPBACK", True),
    },
    # A gateway process that has not refreshed its heartbeat for this long is considered dead,
    # and the connections it registered are no longer routable.
    "PROCESS_HEARTBEAT_INTERVAL_MS": env_int("OPENCLAW_PROCESS_HEARTBEAT_INTERVAL_MS", 10_000),
    "PROCESS_STALE_AFTER_MS": env_int("OPENCLAW_PROCESS_STALE_AFTER_MS", 35_000),
}

# --- Model provider ---------------------------------------------------------------------------
# No base URL: the built-in deterministic "echo" provider. A base URL: an OpenAI-compatible
# endpoint streamed with POST {BASE_URL}/chat/completions.
OPENCLAW_MODEL = {
    "PROVIDER": os.environ.get("OPENCLAW_MODEL_PROVIDER", "").strip()
    or ("openai" if os.environ.get("OPENCLAW_MODEL_BASE_URL", "").strip() else "echo"),
    "BASE_URL": os.environ.get("OPENCLAW_MODEL_BASE_URL", "").strip().rstrip("/"),
    "API_KEY": os.environ.get("OPENCLAW_MODEL_API_KEY", "").strip(),
    "MODEL": os.environ.get("OPENCLAW_MODEL", "").strip() or "echo",
    "CONNECT_TIMEOUT_S": float(os.environ.get("OPENCLAW_MODEL_CONNECT_TIMEOUT_S", "10")),
    # Longest silence allowed between two streamed chunks (or before a non-streamed reply).
    "READ_TIMEOUT_S": float(os.environ.get("OPENCLAW_MODEL_READ_TIMEOUT_S", "60")),
    # Whole turn, start to last byte.
    "TOTAL_TIMEOUT_S": float(os.environ.get("OPENCLAW_MODEL_TOTAL_TIMEOUT_S", "600")),
    # The model sees at most this many of the newest transcript messages.
    "CONTEXT_MESSAGES": env_int("OPENCLAW_MODEL_CONTEXT_MESSAGES", 200),
}

# --- Misc -----------------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = STATE_DIR / "static"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("OPENCLAW_LOG_LEVEL", "INFO")},
    "loggers": {
        "daphne": {"level": "WARNING"},
        "django.channels.server": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
    },
}
