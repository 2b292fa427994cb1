"""The OpenTelemetry SDK set up the way a host sets it up, exporting to files a test (or a
person) reads: each process appends its finished spans and its metrics, one JSON object a
line, to `spans-PID.jsonl` and `metrics-PID.jsonl` in one directory, through the SDK's own
console exporters. Spans are written as each ends (a SIGKILLed worker loses only the span
it was in); metrics every `interval` seconds and at exit.

    AGENTRUN_TELEMETRY_DIR=/tmp/traces celery -A example_project worker   # the example project installs it
    python -m django_agentrun.testing.telemetry /tmp/traces                # the span trees, as text

Needs `opentelemetry-sdk` (the `test` extra).
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["in_memory", "install", "read_metrics", "read_spans", "render", "span_dict"]

_INSTALLED: list[Any] = []


def install(directory: str | os.PathLike[str], *, interval: float | None = None) -> None:
    """Install an SDK tracer and meter provider (once per process) that write to
    `directory`, the metrics every `interval` seconds (AGENTRUN_TELEMETRY_INTERVAL, 0.2)."""
    if interval is None:
        interval = float(os.environ.get("AGENTRUN_TELEMETRY_INTERVAL") or 0.2)
    if _INSTALLED:
        return
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        ConsoleMetricExporter,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "agentrun")})
    spans = open(folder / f"spans-{pid}.jsonl", "a", buffering=1)  # noqa: SIM115 - kept open
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(
        SimpleSpanProcessor(ConsoleSpanExporter(out=spans, formatter=_span_line))
    )
    trace.set_tracer_provider(tracer_provider)
    points = open(folder / f"metrics-{pid}.jsonl", "a", buffering=1)  # noqa: SIM115
    exporter = ConsoleMetricExporter(
        out=points, formatter=lambda data: data.to_json(indent=None) + "\n"
    )
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=interval * 1000)
    meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    metrics.set_meter_provider(meter_provider)
    _INSTALLED.extend([tracer_provider, meter_provider, spans, points])


def in_memory() -> tuple[Any, Any]:
    """An SDK tracer and meter provider in this process that keep what they record (the
    SDK's in-memory span exporter and metric reader), installed once per process (as
    `install`, which it excludes); (exporter, reader)."""
    if _INSTALLED:
        return _INSTALLED[0], _INSTALLED[1]
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    _INSTALLED.extend([exporter, reader])
    return exporter, reader


def _span_line(span: Any) -> str:
    return json.dumps(span_dict(span), default=list) + "\n"


def span_dict(span: Any) -> dict[str, Any]:
    """A finished SDK span as the files hold it."""
    context = span.get_span_context()
    parent = span.parent
    return {
        "name": span.name,
        "trace_id": format(context.trace_id, "032x"),
        "span_id": format(context.span_id, "016x"),
        "parent_id": format(parent.span_id, "016x") if parent is not None else None,
        "kind": span.kind.name,
        "scope": span.instrumentation_scope.name if span.instrumentation_scope else "",
        "start": span.start_time,
        "end": span.end_time,
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
        "events": [{"name": e.name, "attributes": dict(e.attributes or {})} for e in span.events],
        "links": [format(link.context.span_id, "016x") for link in span.links],
        "pid": os.getpid(),
    }


def read_spans(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every span the processes wrote, in the order they ended (by end time)."""
    spans = []
    for path in sorted(Path(directory).glob("spans-*.jsonl")):
        spans.extend(json.loads(line) for line in path.read_text().splitlines() if line)
    return sorted(spans, key=lambda s: s["end"] or 0)


def read_metrics(directory: str | os.PathLike[str]) -> dict[str, list[dict[str, Any]]]:
    """Each metric's points, by name: the newest export of each process (cumulative), each
    point a dict of `attributes` and its `value` (a sum or gauge) or `count` and `sum`."""
    newest: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for path in sorted(Path(directory).glob("metrics-*.jsonl")):
        for line in path.read_text().splitlines():
            if not line:
                continue
            for resource in json.loads(line).get("resource_metrics", []):
                for scope in resource.get("scope_metrics", []):
                    for metric in scope.get("metrics", []):
                        points = metric.get("data", {}).get("data_points", [])
                        newest[(path.name, metric["name"])] = [
                            {**p, "unit": metric.get("unit")} for p in points
                        ]
    merged: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for (_, name), points in newest.items():
        merged[name].extend(points)
    return dict(merged)


def render(spans: Iterable[dict[str, Any]]) -> str:
    """The span trees, one per trace, indented, with the attributes that say most."""
    spans = list(spans)
    children: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    ids = {s["span_id"] for s in spans}
    for s in sorted(spans, key=lambda s: s["start"] or 0):
        children[s["parent_id"] if s["parent_id"] in ids else None].append(s)
    lines: list[str] = []

    def walk(span: dict[str, Any], depth: int) -> None:
        ms = ((span["end"] or 0) - (span["start"] or 0)) / 1e6
        a = span["attributes"]
        facts = " ".join(
            f"{k}={a[k]}"
            for k in (
                "gen_ai.agent.name",
                "gen_ai.tool.name",
                "agentrun.turn.index",
                "agentrun.outcome",
                "pid",
            )
            if k in a
        )
        lines.append(f"{'  ' * depth}{span['name']}  {ms:.1f} ms  [pid {span['pid']}] {facts}")
        for event in span["events"]:
            lines.append(f"{'  ' * (depth + 1)}* {event['name']}")
        for child in children.get(span["span_id"], []):
            walk(child, depth + 1)

    # A span whose parent was never exported (its process was killed) is a root too.
    traces: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for root in children.get(None, []):
        traces[root["trace_id"]].append(root)
    for trace_id, roots in traces.items():
        lines.append(f"trace {trace_id}")
        for root in roots:
            walk(root, 1)
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(read_spans(sys.argv[1] if len(sys.argv) > 1 else ".")))
