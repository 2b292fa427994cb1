"""Telemetry's overhead: the engine's cost per turn with an OpenTelemetry SDK installed
(spans through a BatchSpanProcessor, metrics through a periodic reader, both to no-op
exporters: what a host pays before the network) against none (the API's no-ops).

    python bench/telemetry.py [--rounds N] [--runs N] [--k K]

The workload is bench/engine.py's: the in-process engine, a zero-latency scripted model
(bench/clients.py: no `anthropic` SDK, so no SDK `chat` span: what is measured is this
app's own spans and metrics), read_only tools that return at once, the wake-up publish
stubbed out, runs of `TURNS` turns with k tool calls each, one task carrying each run.
A tracer provider is set once per process, so each mode runs in a process of its own:
rounds alternate the two (in a rotating order), and the figure is the median over rounds
of each round's paired ratio (on / off). Target: at most 1.1x.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TURNS = 10
TARGET = 1.1


def install_sdk() -> None:
    """An SDK as a host installs it, exporting to nowhere."""
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        MetricExporter,
        MetricExportResult,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class NoSpans(SpanExporter):
        def export(self, spans):  # noqa: ANN001
            return SpanExportResult.SUCCESS

    class NoMetrics(MetricExporter):
        def export(self, metrics_data, timeout_millis=10_000, **kwargs):  # noqa: ANN001
            return MetricExportResult.SUCCESS

        def force_flush(self, timeout_millis=10_000):  # noqa: ANN001
            return True

        def shutdown(self, timeout_millis=30_000, **kwargs):  # noqa: ANN001
            return None

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(NoSpans()))
    trace.set_tracer_provider(provider)
    # The SDK's default interval (60 s): each collection also counts the approvals waiting.
    reader = PeriodicExportingMetricReader(NoMetrics(), export_interval_millis=60_000)
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))


def child(mode: str, runs: int, k: int) -> None:
    """Run `runs` runs (after two to warm up) in this process; print the ms per turn."""
    if mode == "on":
        install_sdk()
    from bench import common

    common.setup_django()
    from opentelemetry import trace

    from bench.clients import BenchClient
    from bench.engine import _stub_dispatch
    from django_agentrun import start_run
    from django_agentrun.engine import Outcome, advance

    recording = trace.get_tracer("bench").start_span("probe").is_recording()
    assert recording == (mode == "on"), (mode, recording)
    client = BenchClient()
    task, _ = _stub_dispatch()
    per_turn, cpu_per_turn = [], []
    try:
        for r in range(runs + 2):
            run = start_run("bench-engine", f"k={k} turns={TURNS} id={mode}{r}")
            start, cpu = time.perf_counter(), time.process_time()
            turns = 0
            while True:
                outcome = advance(run.pk, client=client)
                turns += 1
                if outcome != Outcome.CONTINUED:
                    break
            elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
            run.refresh_from_db()
            assert run.state == "completed", (run.state, run.error_code)
            if r >= 2:
                per_turn.append(elapsed * 1000 / run.turn_count)
                cpu_per_turn.append(cpu * 1000 / run.turn_count)
    finally:
        del task.apply_async
    print(json.dumps({"mode": mode, "wall": per_turn, "cpu": cpu_per_turn}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds (default 6)")
    parser.add_argument("--runs", type=int, default=12, help="runs per mode per round")
    parser.add_argument("--k", type=int, default=1, help="tool calls per turn (default 1)")
    parser.add_argument("--child", choices=("on", "off"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.runs, args.k)
        return 0
    figures = {(kind, mode): [] for kind in ("wall", "cpu") for mode in ("on", "off")}
    ratios: dict[str, list[float]] = {"wall": [], "cpu": []}
    for r in range(args.rounds):
        order = ("off", "on") if r % 2 == 0 else ("on", "off")
        medians = {}
        for mode in order:
            done = subprocess.run(
                [sys.executable, __file__, "--child", mode, "--runs", str(args.runs)]
                + ["--k", str(args.k)],
                capture_output=True,
                text=True,
                cwd=ROOT,
                check=True,
            )
            result = json.loads(done.stdout.strip().splitlines()[-1])
            for kind in ("wall", "cpu"):
                medians[kind, mode] = statistics.median(result[kind])
                figures[kind, mode].append(medians[kind, mode])
        for kind in ("wall", "cpu"):
            ratios[kind].append(medians[kind, "on"] / medians[kind, "off"])
        print(
            f"  round {r + 1}: wall off {medians['wall', 'off']:.3f} on {medians['wall', 'on']:.3f}"
            f" ms/turn ({ratios['wall'][-1]:.3f}x); CPU off {medians['cpu', 'off']:.3f}"
            f" on {medians['cpu', 'on']:.3f} ms/turn ({ratios['cpu'][-1]:.3f}x)",
            flush=True,
        )
    print(f"Telemetry overhead, a turn with {args.k} tool call(s), {TURNS}-turn runs:")
    for kind, label in (("wall", "wall time"), ("cpu", "CPU time (this process)")):
        off = statistics.median(figures[kind, "off"])
        on = statistics.median(figures[kind, "on"])
        ratio = statistics.median(ratios[kind])
        verdict = "OK" if ratio <= TARGET else "MISS"
        print(f"  {label}:")
        print(f"    telemetry off (no SDK):             {off:.3f} ms per turn")
        print(f"    telemetry on (SDK, no-op exporter): {on:.3f} ms per turn")
        print(
            f"    on / off (median of paired rounds): {ratio:.3f}x (target <= {TARGET}x) {verdict}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
