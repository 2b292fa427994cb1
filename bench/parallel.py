"""7. Parallel tool calls, in-process: one turn in which the model asks for four read-only
lookups of 200 ms each, then answers. The calls run as one batch (in flight in one commit,
at once on AGENTRUN_TOOL_CONCURRENCY threads, their results in one commit); the same turn
with AGENTRUN_TOOL_CONCURRENCY = 1 (each call alone, one after another) is measured in the
same run. The figure is the wall time of the whole advance: the claim, the model's two
answers (zero latency), the four calls and every commit. Target: at most 300 ms, not 800.
"""

from __future__ import annotations

import time

from .common import check, figure, median, pct, section, table

NAME = "parallel"
K, MS = 4, 200
TARGET_MS = 300.0


def run(quick: bool) -> None:
    from django.test.utils import override_settings

    from django_agentrun import start_run
    from django_agentrun.engine import Outcome, advance
    from django_agentrun.models import Run

    from .clients import BenchClient
    from .engine import _stub_dispatch

    section(f"7. Parallel tool calls ({K} read-only calls of {MS} ms in one turn, in-process)")
    client = BenchClient()
    task, _ = _stub_dispatch()
    rounds = 3 if quick else 10
    # (concurrency, ms): the batch, the same calls one after another, the batch of calls that
    # return at once (what the rest of the advance costs: claim, answers, commits).
    times: dict[tuple[int, int], list[float]] = {(8, MS): [], (1, MS): [], (8, 0): []}
    run_ids = []
    try:
        for r in range(rounds + 1):  # the first round warms up
            for concurrency, ms in times:
                with override_settings(AGENTRUN_TOOL_CONCURRENCY=concurrency):
                    text = f"k={K} ms={ms} id={r}-{concurrency}-{ms}"
                    run_obj = start_run("bench-parallel", text)
                    run_ids.append(run_obj.pk)
                    start = time.perf_counter()
                    outcome = advance(run_obj.pk, client=client)
                    elapsed = time.perf_counter() - start
                if outcome != Outcome.FINISHED:
                    raise RuntimeError(f"parallel bench: the run ended {outcome}")
                if r:
                    times[concurrency, ms].append(elapsed)
    finally:
        del task.apply_async
    states = set(Run.objects.filter(pk__in=run_ids).values_list("state", flat=True))
    if states != {"completed"}:
        raise RuntimeError(f"parallel bench: runs ended {states}")
    labels = {
        (8, MS): f"a batch, {MS} ms each",
        (1, MS): f"one after another (concurrency 1), {MS} ms each",
        (8, 0): "a batch, returning at once",
    }
    rows = [
        [
            labels[key],
            f"{median(v) * 1000:.1f}",
            f"{pct(v, 90) * 1000:.1f}",
            len(v),
        ]
        for key, v in times.items()
    ]
    print(table(["tool calls", "median ms", "p90 ms", "runs"], rows))
    batch, serial = median(times[8, MS]) * 1000, median(times[1, MS]) * 1000
    rest = median(times[8, 0]) * 1000
    figure(
        NAME,
        f"{K} x {MS} ms read-only calls, one turn",
        f"{batch:.1f} ms (one after another: {serial:.1f}; without the latency: {rest:.1f})",
    )
    check(
        NAME,
        f"{K} x {MS} ms read-only calls in one turn <= {TARGET_MS:.0f} ms",
        batch <= TARGET_MS,
        f"{batch:.1f} ms",
    )
