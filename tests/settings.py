"""Test settings: the example project plus the test app; Postgres when DATABASE_URL is set."""

import json
import os
import sys

import django

# `make test-postgres-psycopg2`: Django falls back to psycopg2 when psycopg (3) cannot be
# imported, as in a project that only has psycopg2 installed. Inherited by worker processes.
if os.environ.get("AGENTRUN_TEST_PSYCOPG2"):
    sys.modules["psycopg"] = None  # type: ignore[assignment]

# The example project needs a secret from the environment; the tests' (and their worker
# processes', which inherit it) is made up here.
os.environ.setdefault("DJANGO_SECRET_KEY", "tests-only-" + "x" * 50)
from example_project.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]  # noqa: F405

AGENTRUN_MODEL_CLIENT = os.environ.get(
    "AGENTRUN_MODEL_CLIENT", "django_agentrun.testing.ScriptedClient"
)
# Integration tests point the test process and its workers at their own broker db (9 on the
# Redis server AGENTRUN_TEST_REDIS names) and queue.
CELERY_BROKER_URL = (
    os.environ.get("AGENTRUN_TEST_BROKER_URL")
    or f"{os.environ.get('AGENTRUN_TEST_REDIS', 'redis://127.0.0.1:6379').rstrip('/')}/9"
)
AGENTRUN_QUEUE = os.environ.get("AGENTRUN_QUEUE") or None
# Live streams: off unless a test (or the processes it starts) names a Redis of its own
# (db 13 with a random key prefix: tests/streams.py).
AGENTRUN_STREAM_URL = os.environ.get("AGENTRUN_STREAM_URL", "")
# The rate-limit governor: off unless a test (or the workers it starts) names its Redis
# (tests/db/test_governor.py, tests/workers/test_governor.py).
AGENTRUN_GOVERNOR_URL = os.environ.get("AGENTRUN_GOVERNOR_URL", "")
# Webhooks: the worker tier's receiver (tests/workers/test_webhooks.py) names its
# subscriptions and the settings that go with them, as JSON, for its workers.
for _name, _value in json.loads(os.environ.get("AGENTRUN_TEST_WEBHOOK_SETTINGS", "{}")).items():
    globals()[f"AGENTRUN_{_name}"] = _value
AGENTRUN_STREAM_PREFIX = os.environ.get("AGENTRUN_STREAM_PREFIX", "agentrun-test:stream")
for _name in (
    "STREAM_KEEPALIVE_SECONDS",
    "STREAM_POLL_SECONDS",
    "STREAM_RECHECK_SECONDS",
    "CAPPED_RETRY_SECONDS",
):
    if os.environ.get(f"AGENTRUN_{_name}"):
        globals()[f"AGENTRUN_{_name}"] = float(os.environ[f"AGENTRUN_{_name}"])
# Open streams per user (tests/workers/test_stream_hub.py: many watchers, one user).
if os.environ.get("AGENTRUN_STREAM_MAX_PER_USER"):
    _limit = os.environ["AGENTRUN_STREAM_MAX_PER_USER"]
    AGENTRUN_STREAM_MAX_PER_USER = None if _limit == "none" else int(_limit)
# A cap on the runs of one fair-share key worked at once (tests/workers/test_governor.py).
if os.environ.get("AGENTRUN_MAX_RUNS_PER_KEY"):
    AGENTRUN_MAX_RUNS_PER_KEY = int(os.environ["AGENTRUN_MAX_RUNS_PER_KEY"])
# The tests' users start every test agent through the API (the default asks for the
# agentrun.start_run permission: tests/db/test_author_controls.py checks it).
AGENTRUN_API_START = True
# Django 6.1 asks for MAILERS (a project without them is warned at each e-mail, an error
# here); the test runner swaps its backend for the in-memory one (mail.outbox).
if django.VERSION >= (6, 1):
    MAILERS = {"default": {"BACKEND": "django.core.mail.backends.locmem.EmailBackend"}}
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):  # noqa: F405
    DATABASES["default"]["NAME"] = ":memory:"  # noqa: F405
    DATABASES["default"]["TEST"] = {"NAME": ":memory:"}  # noqa: F405
# Django's psycopg option for server-side parameter binding (the engine's raw SQL must work
# with either); `make test-postgres-ssb` runs the unit tier with it.
if os.environ.get("AGENTRUN_TEST_SERVER_SIDE_BINDING") and DATABASES["default"]["ENGINE"].endswith(  # noqa: F405
    "postgresql"
):
    DATABASES["default"].setdefault("OPTIONS", {})["server_side_binding"] = True  # noqa: F405
# Behind a connection pooler (`make test-pgbouncer`: tests/pgbouncer.py starts PgBouncer and
# names its port): every connection of the test process and of its workers goes through it;
# the test database is created and dropped on the direct port (AGENTRUN_TEST_SETUP_PORT,
# tests/conftest.py). In transaction mode Django needs DISABLE_SERVER_SIDE_CURSORS; nothing
# of the app's own is changed.
AGENTRUN_TEST_SETUP_PORT = None
if os.environ.get("AGENTRUN_TEST_POOLER_PORT") and DATABASES["default"]["ENGINE"].endswith(  # noqa: F405
    "postgresql"
):
    AGENTRUN_TEST_SETUP_PORT = DATABASES["default"].get("PORT") or 5432  # noqa: F405
    DATABASES["default"]["PORT"] = int(os.environ["AGENTRUN_TEST_POOLER_PORT"])  # noqa: F405
    if os.environ.get("AGENTRUN_TEST_POOLER_MODE", "transaction") == "transaction":
        DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True  # noqa: F405
# Django's own connection pool (psycopg 3, Django 5.1+): `make test-django-pool` (`1`:
# psycopg_pool's defaults, at most 4 connections; or the pool's options as JSON, as
# tests/workers/test_django_pool.py gives its worker).
if os.environ.get("AGENTRUN_TEST_DJANGO_POOL") and DATABASES["default"]["ENGINE"].endswith(  # noqa: F405
    "postgresql"
):
    _pool = os.environ["AGENTRUN_TEST_DJANGO_POOL"]
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = (  # noqa: F405
        json.loads(_pool) if _pool.startswith("{") else True
    )
