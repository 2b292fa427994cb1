"""The app's OpenTelemetry instruments, created once through `opentelemetry-api` (proxies:
they follow the meter provider a host sets later, or stay no-ops): what is measured, in
the GenAI semantic conventions and the app's own `agentrun.*` names. When and with which
attributes each is recorded is telemetry.py's."""

from __future__ import annotations

from opentelemetry import metrics

SEMCONV_VERSION = "1.41.0"
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
SCOPE = "django_agentrun"

# The conventions' advice for the two GenAI client histograms.
DURATION_BUCKETS = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                    40.96, 81.92]  # fmt: skip
TOKEN_BUCKETS = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                 16777216, 67108864]  # fmt: skip
# Runs and approvals last longer than a model call: up to a day.
LONG_BUCKETS = [0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 14400, 86400]

meter = metrics.get_meter(SCOPE, schema_url=SCHEMA_URL)

TOKEN_USAGE = meter.create_histogram(
    "gen_ai.client.token.usage",
    unit="{token}",
    description="Number of input and output tokens used.",
    explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
)
OPERATION_DURATION = meter.create_histogram(
    "gen_ai.client.operation.duration",
    unit="s",
    description="GenAI operation duration.",
    explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
)
RUNS_STARTED = meter.create_counter(
    "agentrun.runs.started", unit="{run}", description="Runs created, by agent."
)
RUNS_FINISHED = meter.create_counter(
    "agentrun.runs.finished", unit="{run}", description="Runs that ended, by agent and state."
)
RUN_DURATION = meter.create_histogram(
    "agentrun.run.duration",
    unit="s",
    description="From a run's creation to its end, by agent and final state.",
    explicit_bucket_boundaries_advisory=LONG_BUCKETS,
)
TURN_DURATION = meter.create_histogram(
    "agentrun.turn.duration",
    unit="s",
    description="From a turn's start to its close (the model's answer and its tools).",
    explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
)
TOOL_DURATION = meter.create_histogram(
    "agentrun.tool.duration",
    unit="s",
    description="A tool handler's run, by tool and outcome.",
    explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
)
QUEUE_LAG = meter.create_histogram(
    "agentrun.run.queue_lag",
    unit="s",
    description="From a run's being queued to a worker's first claim of it.",
    explicit_bucket_boundaries_advisory=LONG_BUCKETS,
)
RECOVERIES = meter.create_counter(
    "agentrun.recoveries",
    unit="{recovery}",
    description="Runs taken over after their worker died or stopped, and in-flight calls settled.",
)
MODEL_RETRIES = meter.create_counter(
    "agentrun.model.retries", unit="{retry}", description="Model requests retried, by status."
)
COST = meter.create_counter(
    "agentrun.cost", unit="USD", description="What the model's answers cost, by agent and model."
)
