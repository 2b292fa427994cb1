"""Django settings of the benchmarks: the example project, the bench app, Postgres.

Used by the bench process and by the Celery workers it starts (the workers get
DATABASE_URL, BENCH_BROKER_URL, AGENTRUN_QUEUE, ... through their environment).
"""

from __future__ import annotations

import os

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/agentrun_bench"
DEFAULT_BROKER_URL = "redis://127.0.0.1:6379/12"

os.environ.setdefault("DATABASE_URL", DEFAULT_DATABASE_URL)

# The example project needs a secret from the environment: the benchmark's is made up.
os.environ.setdefault("DJANGO_SECRET_KEY", "bench-only-" + "x" * 50)
from example_project.settings import *  # noqa: E402, F403

INSTALLED_APPS = [*INSTALLED_APPS, "bench.benchapp"]  # noqa: F405

# Production-like: no per-query debug log.
DEBUG = False
DATABASES["default"]["CONN_MAX_AGE"] = float(os.environ.get("BENCH_CONN_MAX_AGE", "0"))  # noqa: F405

CELERY_BROKER_URL = os.environ.get("BENCH_BROKER_URL", DEFAULT_BROKER_URL)
AGENTRUN_QUEUE = os.environ.get("AGENTRUN_QUEUE") or None
AGENTRUN_MODEL_CLIENT = os.environ.get("AGENTRUN_MODEL_CLIENT", "bench.clients.BenchClient")
# bench/streams.py connects all its clients as one user.
AGENTRUN_STREAM_MAX_PER_USER = None

LOGGING["loggers"]["django_agentrun"]["level"] = os.environ.get(  # noqa: F405
    "AGENTRUN_LOG_LEVEL", "WARNING"
)
