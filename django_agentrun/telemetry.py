"""OpenTelemetry traces, metrics and log fields, in the GenAI semantic conventions
(semantic-conventions 1.41.0, status Development), through `opentelemetry-api` only.

Without an SDK installed by the host every call here is the API's no-op: no span records,
no instrument aggregates. With one:

- one trace per run: `run_created` opens and ends the run's first span (`start_run
  {agent}`, a child of whatever span is current: a view, a task, a script, or the
  `traceparent` a client sent) and returns its W3C context, which the run keeps
  (`Run.trace_context`); every later stretch of work on the run, in any process and
  however much later, is a child of it;
- `invoke_agent {agent}` around each stretch a worker spends on a run (the driver opens
  it after the claim); the `anthropic` SDK's own `chat` span is its child (the SDK parents
  its span on the current one), one per model request, and the app emits no second one:
  it adds what the SDK's span lacks (the finish reasons, the cache writes under the
  conventions' name, the turn, the attempt) to the SDK's (clients/tracing.py);
- `execute_tool {tool}` around each handler invocation;
- approvals and cancels as short spans in the run's trace, recoveries, hand-offs and
  parks as events of the stretch's span.

No content (prompts, answers, tool arguments and results) unless the host opts in:
AGENTRUN_TELEMETRY_CAPTURE_CONTENT, or else the conventions'
OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT. Metric attributes are bounded (agent,
model, tool, state, outcome: never a run id).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .conf import agentrun_settings
from .instruments import (
    COST,
    MODEL_RETRIES,
    OPERATION_DURATION,
    QUEUE_LAG,
    RECOVERIES,
    RUN_DURATION,
    RUNS_FINISHED,
    RUNS_STARTED,
    SCHEMA_URL,
    SCOPE,
    TOKEN_USAGE,
    TOOL_DURATION,
    TURN_DURATION,
    meter,
)

PROVIDER = "anthropic"
# The one value of OTEL_SEMCONV_STABILITY_OPT_IN that concerns GenAI: this app never
# emitted an older version of the conventions, so it emits the latest with or without it.
OPT_IN = "gen_ai_latest_experimental"

_W3C = TraceContextTextMapPropagator()
# Proxies: they follow the provider a host sets later (or stay no-ops).
_tracer = trace.get_tracer(SCOPE, schema_url=SCHEMA_URL)


# -- settings ------------------------------------------------------------------------------


def capture_content() -> bool:
    """Whether prompts, answers, tool arguments and results go into spans: the setting
    AGENTRUN_TELEMETRY_CAPTURE_CONTENT, or (None) the conventions' environment variable."""
    setting = agentrun_settings.TELEMETRY_CAPTURE_CONTENT
    if setting is not None:
        return bool(setting)
    value = os.environ.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "")
    return value.strip().lower() in ("true", "1", "span_only", "span_and_event")


def latest_conventions() -> bool:
    """Whether OTEL_SEMCONV_STABILITY_OPT_IN asks for the latest GenAI conventions (what
    this app emits either way: it never emitted an older version)."""
    values = os.environ.get("OTEL_SEMCONV_STABILITY_OPT_IN", "")
    return OPT_IN in (v.strip() for v in values.split(","))


# -- the run's trace context ----------------------------------------------------------------


def headers_context(headers: Mapping[str, str]) -> Any:
    """The context a request's W3C `traceparent`/`tracestate` headers carry (the API's
    propagator parses them), or None when it carries none that is valid."""
    carrier = {k: headers[k] for k in ("traceparent", "tracestate") if headers.get(k)}
    if "traceparent" not in carrier:
        return None
    ctx = _W3C.extract(carrier)
    if not trace.get_current_span(ctx).get_span_context().is_valid:
        return None
    return ctx


@contextmanager
def continued(headers: Mapping[str, str]) -> Iterator[None]:
    """Within: the trace the request's `traceparent` names is current, unless a span is
    current already (the host's own instrumentation of the request, itself continuing it)."""
    ctx = None
    if not trace.get_current_span().get_span_context().is_valid:
        ctx = headers_context(headers)
    token = otel_context.attach(ctx) if ctx is not None else None
    try:
        yield
    finally:
        if token is not None:
            otel_context.detach(token)


def run_created(run: Any) -> dict[str, str]:
    """The run's first span, opened and ended at its creation in the current trace (or a
    new one); its W3C context, which the run keeps ({} without an SDK)."""
    RUNS_STARTED.add(1, {"gen_ai.agent.name": run.agent})
    attributes = {**_run_attributes(run), "gen_ai.operation.name": "start_run"}
    with _tracer.start_as_current_span(
        f"start_run {run.agent}", kind=SpanKind.INTERNAL, attributes=attributes
    ) as span:
        if capture_content():
            span.set_attribute("gen_ai.input.messages", _messages("user", run.input))
        carrier: dict[str, str] = {}
        _W3C.inject(carrier)
    return carrier


def _run_context(run: Any) -> Any:
    """The run's stored context (None: it was created without an SDK, or before 0.4)."""
    stored = getattr(run, "trace_context", None)
    if not stored:
        return None
    return _parsed(stored.get("traceparent"), stored.get("tracestate"))


@lru_cache(maxsize=1024)
def _parsed(traceparent: str | None, tracestate: str | None) -> Any:
    """A stored context as the propagator reads it (None: not valid). Parsed once per run
    and process, not once per stretch (a context is immutable: one serves every stretch)."""
    carrier = {"traceparent": traceparent, "tracestate": tracestate}
    ctx = _W3C.extract({k: v for k, v in carrier.items() if v})
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def _run_attributes(run: Any) -> dict[str, Any]:
    attributes = {
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.agent.name": run.agent,
        "agentrun.run.id": str(run.pk),
    }
    if getattr(run, "conversation_id", None):
        attributes["gen_ai.conversation.id"] = str(run.conversation_id)
    return attributes


@contextmanager
def in_run(run: Any, name: str, **attributes: Any) -> Iterator[Any]:
    """A short span in the run's trace (an approval, a cancel), made where it happens."""
    parent = _run_context(run)
    links = _current_link() if parent is not None else None
    with _tracer.start_as_current_span(
        f"{name} {run.agent}",
        context=parent,
        kind=SpanKind.INTERNAL,
        attributes={**_run_attributes(run), **attributes},
        links=links,
    ) as span:
        yield span


def decided(run: Any, call: Any, decision: str) -> None:
    """A person decided on a waiting call: a short span in the run's trace, with the wait."""
    attributes = {
        "gen_ai.tool.name": call.name,
        "gen_ai.tool.call.id": call.tool_call_id,
        "agentrun.approval.decision": decision,
    }
    if call.decided_at is not None and call.created_at is not None:
        waited = (call.decided_at - call.created_at).total_seconds()
        attributes["agentrun.approval.wait_seconds"] = max(waited, 0.0)
    with in_run(run, "approval", **attributes):
        pass


def cancel_requested(run: Any, applied: bool) -> None:
    """A cancel was asked for: a short span in the run's trace."""
    with in_run(run, "cancel", **{"agentrun.cancel.applied_at_once": applied}):
        pass


def _current_link() -> list[Link] | None:
    """The span current where run work starts (a Celery task's, a request's), linked."""
    current = trace.get_current_span().get_span_context()
    return [Link(current)] if current.is_valid else None


# -- a worker's stretch of work on a run ----------------------------------------------------


class Stretch:
    """The `invoke_agent` span of one stretch of a worker's work on a run, and the log
    fields of the records made within."""

    def __init__(self, span: Any, run: Any, began: float) -> None:
        self.span = span
        self.run = run
        self.began = began
        self.recording = span.is_recording()
        self.fields: dict[str, Any] = {"run_id": str(run.pk), "agent": run.agent, "turn": None}
        # Which attempt at the current turn's answer the next model request is (1: the first).
        self.attempt = 1
        # The cost of its answers by (agent, model), added to agentrun.cost once, at its end.
        self.costs: dict[tuple[str, str], float] = {}

    def spent(self) -> None:
        for (agent, model), usd in self.costs.items():
            COST.add(usd, _model_attributes(agent, model))
        self.costs.clear()

    def event(self, name: str, **attributes: Any) -> None:
        if self.recording:
            self.span.add_event(name, attributes)


# The stretch the current context works in (None elsewhere): its log fields, its span.
_STRETCH: ContextVar[Stretch | None] = ContextVar("agentrun_stretch", default=None)


@contextmanager
def invoke_agent(run: Any, model: str, *, recovery: bool = False) -> Iterator[Stretch]:
    """The span of one stretch of work on `run` (from the claim to the hand-off, park or
    end): a child of the run's first span, current within, with the log fields set."""
    parent = _run_context(run)
    attributes = {
        **_run_attributes(run),
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.request.model": model,
    }
    if recovery:
        attributes["agentrun.recovery"] = True
    span = _tracer.start_span(
        f"invoke_agent {run.agent}",
        context=parent,
        kind=SpanKind.INTERNAL,
        attributes=attributes,
        links=_current_link() if parent is not None else None,
    )
    stretch = Stretch(span, run, time.monotonic())
    token = _STRETCH.set(stretch)
    try:
        with trace.use_span(span, end_on_exit=True):
            yield stretch
    finally:
        _STRETCH.reset(token)
        stretch.spent()


def at_turn(index: int) -> None:
    """The turn the current stretch asks the model for (the log fields, the `chat` span's
    turn and attempt)."""
    stretch = _STRETCH.get()
    if stretch is not None:
        stretch.fields["turn"] = index
        stretch.attempt = 1


def asking() -> tuple[int, int] | None:
    """The turn the current stretch asks the model for and which attempt at its answer the
    request is (1: the first), or None outside a model turn: what a request's `chat` span
    says of it (clients/tracing.py)."""
    stretch = _STRETCH.get()
    if stretch is None or stretch.fields["turn"] is None:
        return None
    return stretch.fields["turn"], stretch.attempt


def claimed(stretch: Stretch, run: Any, *, first: bool, recovery: bool) -> None:
    """After the claim: the queue lag of a first claim, a recovery counted."""
    attributes = {"gen_ai.agent.name": run.agent}
    if first and run.started_at is not None and run.queued_at is not None:
        lag = (run.started_at - run.queued_at).total_seconds()
        QUEUE_LAG.record(max(lag, 0.0), attributes)
    if recovery:
        RECOVERIES.add(1, {**attributes, "agentrun.recovery.kind": "lease_taken_over"})
        stretch.event("agentrun.recovery", **{"agentrun.recovery.attempts": run.recovery_attempts})


# Metric attributes: a few distinct sets per process (agents, models, tools, states), each
# built once. The SDK copies what it keeps, so one dict serves every measurement.
@lru_cache(maxsize=256)
def _chat_attributes(model: str, response_model: str | None, error: str | None) -> tuple:
    """The attributes of a request's duration, and (answered) of its input and output
    tokens."""
    base = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.request.model": model,
    }
    if error is not None:
        return ({**base, "error.type": error},)
    if response_model:
        base["gen_ai.response.model"] = response_model
    input_, output = ({**base, "gen_ai.token.type": kind} for kind in ("input", "output"))
    return base, input_, output


@lru_cache(maxsize=256)
def _model_attributes(agent: str, model: str | None) -> dict[str, Any]:
    return {"gen_ai.agent.name": agent, "gen_ai.request.model": model}


@lru_cache(maxsize=256)
def _tool_attributes(tool: str, outcome: str) -> dict[str, Any]:
    return {"gen_ai.tool.name": tool, "agentrun.tool.outcome": outcome}


def answered(run: Any, turn: Any, model: str, seconds: float, cost: Any = None) -> None:
    """The model's answer for `turn` (recorded or not): the GenAI client metrics and its
    cost. (The answer's facts are on its request's `chat` span: clients/tracing.py.)"""
    if turn.content is None:  # no answer recorded: the request failed or was stopped
        (failed,) = _chat_attributes(model, None, run.error_code or "_OTHER")
        OPERATION_DURATION.record(seconds, failed)
        return
    duration, input_, output = _chat_attributes(model, turn.model or None, None)
    OPERATION_DURATION.record(seconds, duration)
    cached = (turn.cache_read_input_tokens or 0) + (turn.cache_creation_input_tokens or 0)
    prompt = (turn.input_tokens or 0) + cached
    TOKEN_USAGE.record(prompt, input_)
    TOKEN_USAGE.record(turn.output_tokens or 0, output)
    stretch = _STRETCH.get()
    if cost and stretch is not None:  # one measurement per stretch, not one per answer
        stretch.costs[run.agent, model] = stretch.costs.get((run.agent, model), 0.0) + float(cost)
    elif cost:
        COST.add(float(cost), _model_attributes(run.agent, model))


def model_retry(status: int | None, model: str, *, parked: bool = False) -> None:
    """A retryable model error, retried by the engine: after a pause in the worker's slot,
    or (`parked`: a 429, a 529 or the governor's "not now", without a status) by parking
    the run until the limit allows."""
    attributes: dict[str, Any] = {"gen_ai.request.model": model, "agentrun.retry.parked": parked}
    if status:
        attributes["http.response.status_code"] = status
    MODEL_RETRIES.add(1, attributes)
    stretch = _STRETCH.get()
    if stretch is not None and not parked:  # the next request is the turn's next attempt
        stretch.attempt += 1


def stretch_ended(stretch: Stretch, outcome: str, turns: Iterable[Any]) -> None:
    """The stretch's outcome (continued, parked, finished, lease lost), the durations of
    the turns it closed, and the run's end."""
    run = stretch.run
    wall_began = time.time() - (time.monotonic() - stretch.began)
    for t in reversed(turns):  # the newest first: those it closed are the last ones
        if t.finished_at is None:
            continue  # the turn still open (the run parked, or handed it on)
        if t.finished_at.timestamp() < wall_began:
            break  # closed before this stretch, as every turn before it was
        seconds = (t.finished_at - t.started_at).total_seconds()
        TURN_DURATION.record(max(seconds, 0.0), _model_attributes(run.agent, t.model))
    if not stretch.recording:
        return
    span = stretch.span
    span.set_attributes({"agentrun.outcome": outcome, "agentrun.run.state": run.state})
    if outcome == "parked":
        span.add_event("agentrun.approval_requested")
    elif outcome == "continued":
        span.add_event("agentrun.handed_off")
    if outcome == "finished":
        if capture_content() and run.output is not None:
            span.set_attribute("gen_ai.output.messages", _messages("assistant", run.output))
        if run.state == "failed":
            span.set_status(Status(StatusCode.ERROR, run.error_code or "failed"))
            span.set_attribute("error.type", run.error_code or "_OTHER")


def finished(run: Any, state: str) -> None:
    """A run ended in `state` (completed, failed, cancelled, timed out), whoever ended it (a
    worker, a person, the reaper): called once, after the commit of the write that ended it
    (transitions.py)."""
    attributes = {"gen_ai.agent.name": run.agent, "agentrun.run.state": str(state)}
    RUNS_FINISHED.add(1, attributes)
    if run.created_at is not None:
        RUN_DURATION.record(max(time.time() - run.created_at.timestamp(), 0.0), attributes)


def settled(call: Any, policy: str) -> None:
    """The recovery policy applied to an in-flight call a dead worker left."""
    RECOVERIES.add(1, {"agentrun.recovery.kind": policy, "gen_ai.tool.name": call.name})
    span = trace.get_current_span()
    if span.is_recording():
        span.add_event(
            "agentrun.recovery",
            {
                "gen_ai.tool.call.id": call.tool_call_id,
                "gen_ai.tool.name": call.name,
                "agentrun.recovery.kind": policy,
            },
        )


# -- a tool's execution ---------------------------------------------------------------------


class ToolSpan:
    """The `execute_tool` span of one handler invocation, current while it runs (a child of
    the stretch's span); `end` says how it ended. One context manager (not the API's three
    nested generators): a span per tool call is telemetry's most frequent."""

    __slots__ = ("span", "call", "side_effect", "began", "outcome", "content", "token")

    def __init__(self, call: Any, side_effect: str) -> None:
        self.call = call
        self.side_effect = side_effect
        self.outcome = "executed"

    def __enter__(self) -> ToolSpan:
        call = self.call
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": call.tool_call_id,
            "gen_ai.tool.type": "function",
            "agentrun.tool.side_effect": str(self.side_effect),
            "agentrun.tool.attempt": call.attempt,
        }
        if call.approved and call.decided_at is not None:
            waited = (call.decided_at - call.created_at).total_seconds()
            attributes["agentrun.approval.wait_seconds"] = max(waited, 0.0)
        self.content = content = capture_content()
        if content:
            attributes["gen_ai.tool.call.arguments"] = _json(call.arguments)
        parent = otel_context.get_current()  # read once: the span's parent, then its own
        self.span = span = _tracer.start_span(  # INTERNAL, the default kind
            f"execute_tool {call.name}", parent, attributes=attributes
        )
        self.token = otel_context.attach(trace.set_span_in_context(span, parent))
        self.began = time.perf_counter()
        return self

    def end(self, state: str, is_error: bool, result: Any) -> None:
        self.outcome = "cancelled" if state == "cancelled" else "executed"
        span = self.span
        if not span.is_recording():
            return
        attributes = {"agentrun.tool.outcome": self.outcome, "agentrun.tool.state": state}
        if is_error:
            attributes["error.type"] = "tool_error" if state != "cancelled" else state
            span.set_status(Status(StatusCode.ERROR))
        if self.content:
            attributes["gen_ai.tool.call.result"] = _json(getattr(result, "value", result))
        span.set_attributes(attributes)

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        """As the API's `start_as_current_span` ends a span, and the duration of a handler
        that returned."""
        seconds = time.perf_counter() - self.began
        span = self.span
        try:
            otel_context.detach(self.token)
            if isinstance(exc, Exception) and span.is_recording():
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        finally:
            span.end()
        if exc is None:
            TOOL_DURATION.record(seconds, _tool_attributes(self.call.name, self.outcome))


def execute_tool(call: Any, side_effect: str) -> ToolSpan:
    """The span around a tool handler's invocation: `with execute_tool(...) as span`."""
    return ToolSpan(call, side_effect)


# -- approvals waiting (an observable gauge; the query is the host app's) -------------------


_EXITING: list[bool] = []


def quiet_at_exit() -> None:
    """The process is ending (an `atexit` hook, registered when the app is ready): the
    approval gauges report nothing from now on, so that a meter provider's last collection
    at its shutdown reads no database (`manage.py collectstatic` in a build without one)."""
    _EXITING.append(True)


def observe_approvals(query: Callable[[], Iterable[tuple[str, int, float]]]) -> None:
    """Report, at each collection, the approvals waiting per agent and the oldest one's age
    in seconds: `query()` gives (agent, count, oldest age) rows; none once the process is
    exiting (`quiet_at_exit`)."""
    failed: list[bool] = []

    def rows() -> list[tuple[str, int, float]]:
        if _EXITING:
            return []
        try:
            return list(query())
        except Exception:  # noqa: BLE001 - a collection must never raise
            if not failed:  # once per process: collections come every few seconds
                failed.append(True)
                logging.getLogger(__name__).warning(
                    "Could not count the approvals waiting", exc_info=True
                )
            return []

    def waiting(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {"gen_ai.agent.name": a}) for a, n, _ in rows()]

    def age(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(s, {"gen_ai.agent.name": a}) for a, _, s in rows()]

    meter.create_observable_gauge(
        "agentrun.approvals.waiting",
        callbacks=[waiting],
        unit="{call}",
        description="Tool calls waiting for a person, by agent.",
    )
    meter.create_observable_gauge(
        "agentrun.approvals.oldest_age",
        callbacks=[age],
        unit="s",
        description="How long the oldest tool call waiting for a person has waited, by agent.",
    )


# -- logs ----------------------------------------------------------------------------------


class RunLogFilter(logging.Filter):
    """Adds `run_id`, `agent`, `turn` (the run a worker works on, None elsewhere) and, where
    a span is current, `trace_id` and `span_id` to each record, as attributes a structured
    formatter reads. Never replaces an attribute a record has."""

    def filter(self, record: logging.LogRecord) -> bool:
        stretch = _STRETCH.get()
        fields = stretch.fields if stretch is not None else {}
        for name in ("run_id", "agent", "turn"):
            if not hasattr(record, name):
                setattr(record, name, fields.get(name))
        context = trace.get_current_span().get_span_context()
        if context.is_valid and not hasattr(record, "trace_id"):
            record.trace_id = format(context.trace_id, "032x")
            record.span_id = format(context.span_id, "016x")
        return True


LOG_FILTER = RunLogFilter()


def install_log_filter(names: Iterable[str]) -> None:
    """The filter on each of the app's loggers (a logger's filters are not inherited)."""
    for name in names:
        logger = logging.getLogger(name)
        if LOG_FILTER not in logger.filters:
            logger.addFilter(LOG_FILTER)


# -- content, when the host opts in ---------------------------------------------------------


def _json(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False)


def _messages(role: str, content: Any) -> str:
    """Content as the conventions' messages: a role and its parts."""
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    parts = []
    for block in blocks if isinstance(blocks, list) else [blocks]:
        if isinstance(block, dict) and block.get("type") == "text":
            parts.append({"type": "text", "content": block.get("text", "")})
        else:
            parts.append({"type": "json", "content": block})
    return _json([{"role": role, "parts": parts}])
