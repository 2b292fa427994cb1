"""Settings of the example project: SQLite by default, DATABASE_URL for Postgres.

Safe to copy: DEBUG is off unless DJANGO_DEBUG=1 (no tracebacks to clients), and the
secret comes from the environment (DJANGO_SECRET_KEY; nothing starts without it), except
under the demo commands, which make one up for their own processes."""

from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

# `manage.py agentrun_demo` and `agentrun_chat` run on this machine only: without a secret
# they make one up, in the environment their worker and web processes inherit.
DEMO_COMMANDS = ("agentrun_demo", "agentrun_chat")
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "")
if not SECRET_KEY and sys.argv[1:2] and sys.argv[1] in DEMO_COMMANDS:
    SECRET_KEY = os.environ["DJANGO_SECRET_KEY"] = secrets.token_urlsafe(50)
if not SECRET_KEY:
    raise ImproperlyConfigured(
        "Set DJANGO_SECRET_KEY in the environment, to a long random string: "
        "python -c 'import secrets; print(secrets.token_urlsafe(50))'."
    )
DEBUG = os.environ.get("DJANGO_DEBUG", "0") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "django_agentrun",
    "example_project.demo",
]
for extra_app in filter(None, os.environ.get("AGENTRUN_EXTRA_APPS", "").split(",")):
    INSTALLED_APPS.append(extra_app)

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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
WSGI_APPLICATION = "example_project.wsgi.application"


def _database_from_url(url: str) -> dict:
    import dj_database_url

    return dj_database_url.parse(url, conn_max_age=0)


if os.environ.get("DATABASE_URL"):
    DATABASES = {"default": _database_from_url(os.environ["DATABASE_URL"])}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("SQLITE_PATH", str(BASE_DIR / "db.sqlite3")),
            "OPTIONS": {"timeout": 20},
        }
    }
# Worker subprocesses started by the tests point at the test database by name.
if os.environ.get("AGENTRUN_TEST_DB_NAME"):
    DATABASES["default"]["NAME"] = os.environ["AGENTRUN_TEST_DB_NAME"]
# Several processes on one SQLite file (the demo): IMMEDIATE avoids "database is locked"
# when a transaction that read first tries to write.
if os.environ.get("SQLITE_TRANSACTION_MODE") and DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    DATABASES["default"]["OPTIONS"]["transaction_mode"] = os.environ["SQLITE_TRANSACTION_MODE"]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
STATIC_URL = "static/"
# The project serves its static files itself (the admin's, the chat page's script), with
# DEBUG off too: enough for the example. A deployment collects them (collectstatic) and
# serves them from its web server or WhiteNoise instead: DJANGO_SERVE_STATIC=0.
SERVE_STATIC = os.environ.get("DJANGO_SERVE_STATIC", "1") == "1"

# Celery: Redis by default; the demo switches to a server-less transport when none answers.
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0")
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# JSON, e.g. the folders of kombu's filesystem transport (the demo's server-less broker).
if os.environ.get("CELERY_BROKER_TRANSPORT_OPTIONS"):
    CELERY_BROKER_TRANSPORT_OPTIONS = json.loads(os.environ["CELERY_BROKER_TRANSPORT_OPTIONS"])
CELERY_BEAT_SCHEDULE = {
    "agentrun-reap": {
        "task": "django_agentrun.reap",
        "schedule": float(os.environ.get("AGENTRUN_REAPER_INTERVAL_SECONDS", "10")),
    },
}

# Every write authenticated by a cookie or by Basic credentials (which a browser keeps and
# sends by itself) passes Django's CSRF check: sessions through DRF's own class, Basic
# through the demo's (demo/auth.py: JSON, which no other site's page can send, or a token).
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "example_project.demo.auth.BasicAuthenticationWithCSRF",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
# The OpenAPI document (/api/schema/ and the app's own <mount>/schema/) for signed-in users
# only; DJANGO_PUBLIC_SCHEMA=1 serves /api/schema/ to anyone.
SPECTACULAR_SETTINGS = {
    "SERVE_PERMISSIONS": [
        "rest_framework.permissions.AllowAny"
        if os.environ.get("DJANGO_PUBLIC_SCHEMA") == "1"
        else "rest_framework.permissions.IsAuthenticated"
    ],
}
LOGIN_REDIRECT_URL = "/chat/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

AGENTRUN_MODEL_CLIENT = os.environ.get(
    "AGENTRUN_MODEL_CLIENT", "django_agentrun.clients.anthropic.AnthropicModelClient"
)
AGENTRUN_QUEUE = os.environ.get("AGENTRUN_QUEUE") or None
for _name in (
    "LEASE_SECONDS",
    "HEARTBEAT_SECONDS",
    "TURNS_PER_TASK",
    "REAPER_INTERVAL_SECONDS",
    "QUEUED_STALE_SECONDS",
    "CANCEL_GRACE_SECONDS",
):
    if os.environ.get(f"AGENTRUN_{_name}"):
        globals()[f"AGENTRUN_{_name}"] = float(os.environ[f"AGENTRUN_{_name}"])
if "AGENTRUN_GOVERNOR_URL" in os.environ:  # "": the rate-limit governor off
    AGENTRUN_GOVERNOR_URL = os.environ["AGENTRUN_GOVERNOR_URL"]
if os.environ.get("AGENTRUN_MAX_RECOVERY_ATTEMPTS"):
    AGENTRUN_MAX_RECOVERY_ATTEMPTS = int(os.environ["AGENTRUN_MAX_RECOVERY_ATTEMPTS"])

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "django_agentrun": {
            "handlers": ["console"],
            "level": os.environ.get("AGENTRUN_LOG_LEVEL", "INFO"),
            # Celery workers also log through the root logger: one line, not two.
            "propagate": False,
        },
    },
}

# Telemetry (docs/how-to/telemetry.md). `make demo-traces` (and the tests) name a directory:
# every process writes its spans and metrics there as JSON lines, through the SDK's own
# exporters (`python -m django_agentrun.testing.telemetry DIR` prints the span trees). With
# OTEL_EXPORTER_OTLP_ENDPOINT set and opentelemetry-exporter-otlp installed, the three lines
# a host adds send them to any OTLP viewer (Jaeger, a collector) instead.
if os.environ.get("AGENTRUN_TELEMETRY_DIR"):
    from django_agentrun.testing.telemetry import install as _install_telemetry

    _install_telemetry(os.environ["AGENTRUN_TELEMETRY_DIR"])
elif os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
    from opentelemetry import trace as _trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    _provider = TracerProvider()
    _provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _trace.set_tracer_provider(_provider)
