"""The promise (ARCHITECTURE.md section 1; docs/explanation/durability.md's table) as
checks on a schedule: after every move (`during`), when nothing moves any more (`at_rest`),
and at the end (`after`). Each violation is a sentence; the schedule stops at the first."""

from __future__ import annotations

from typing import Any

from django_agentrun.models import Run, ToolCall
from django_agentrun.states import ResultSource, RunState, SideEffect

from .controller import DONE

CLASSES = {
    "x_pay": SideEffect.NON_IDEMPOTENT,
    "x_charge": SideEffect.NON_IDEMPOTENT,
    "x_refund": SideEffect.NON_IDEMPOTENT,
    "x_look": SideEffect.READ_ONLY,
    "x_note": SideEffect.IDEMPOTENT_WRITE,
}


def during(world: Any) -> None:
    """After every move: effects within their class; no actor failed."""
    truth = world.truth
    for (_run, call_id), effects in truth.effects.items():
        side = CLASSES[effects[0]["tool"]]
        if side == SideEffect.NON_IDEMPOTENT and len(effects) > 1:
            truth.violated(f"non-idempotent {call_id} ran {len(effects)} times: {effects}")
        if side == SideEffect.IDEMPOTENT_WRITE and len({e["key"] for e in effects}) > 1:
            truth.violated(f"idempotent {call_id} ran with different keys: {effects}")
    for actor in world.controller.actors:
        if actor.status == DONE and actor.error is not None:
            truth.violated(f"{actor.name} raised {actor.error!r}\n{actor.trace}")


def at_rest(world: Any, runs: list[Run]) -> None:
    """Nothing moves (every message delivered, the reaper found nothing): a run that waits
    for a person has no cancel request pending (a requested cancel is applied)."""
    for run in runs:
        run.refresh_from_db()
        if run.state == RunState.AWAITING_APPROVAL and run.cancel_requested_at is not None:
            world.truth.violated(
                f"run {str(run.pk)[:8]} waits for a person with a cancel requested "
                f"({run.cancel_reason!r}): the cancel was never applied"
            )


def after(world: Any) -> None:
    """At the end: every result a tool returned to a worker that lived on is recorded;
    every history is valid and rebuilt by its events."""
    from tests.conftest import assert_conversation_projection_matches, assert_projection_matches

    truth = world.truth
    during(world)
    runs = world.runs()
    calls = {(str(c.run_id), c.tool_call_id): c for c in ToolCall.objects.filter(run__in=runs)}
    for key, actors in truth.returned.items():
        call = calls.get(key)
        if call is None or CLASSES[call.name] != SideEffect.NON_IDEMPOTENT:
            continue
        lived = [a for a in actors if a.status == DONE]
        if lived and call.result_source not in (ResultSource.EXECUTED, ResultSource.RECONCILED):
            truth.violated(
                f"{call.name} {call.tool_call_id} returned to {lived[0].name}, which went on, "
                f"but its result was dropped: the call is {call.state} "
                f"({call.result_source}: {call.result!r})"
            )
    for run in runs:
        for turn in run.turns.all():
            used = [b["id"] for b in (turn.content or []) if b.get("type") == "tool_use"]
            for tool_use_id in used:
                call = calls.get((str(run.pk), tool_use_id))
                if call is None or not call.is_closed or call.result is None:
                    state = call.state if call else "missing"
                    truth.violated(
                        f"tool_use {tool_use_id} of run {run.pk} has no result ({state})"
                    )
        try:
            assert_projection_matches(run)
        except AssertionError as exc:
            truth.violated(f"the events of run {run.pk} do not rebuild it: {exc}")
    if world.scenario.webhooks:
        _webhooks(world, runs)
    if runs and runs[0].conversation_id is not None:
        try:
            assert_conversation_projection_matches(runs[0].conversation)
        except AssertionError as exc:
            truth.violated(f"the conversation's events do not rebuild its history: {exc}")


def _webhooks(world: Any, runs: list[Run]) -> None:
    """Each reportable event of a committed change has one delivery (one webhook id), and
    every delivery was sent (the runs are at rest, their senders done)."""
    from collections import Counter

    from django_agentrun.models import RunEvent, WebhookDelivery
    from django_agentrun.store import outbox

    for run in runs:
        wanted: Counter = Counter()
        for kind in RunEvent.objects.filter(run=run).values_list("type", flat=True):
            if kind in outbox.EVENTS:
                wanted[outbox.EVENTS[kind]] += 1
                if run.conversation_id and outbox.EVENTS[kind] in outbox.RUN_ENDINGS:
                    wanted[outbox.CONVERSATION_RUN_FINISHED] += 1
        rows = WebhookDelivery.objects.filter(run_id=run.pk)
        made = Counter(rows.values_list("event_type", flat=True))
        if made != wanted:
            world.truth.violated(f"run {run.pk}: deliveries {dict(made)} for events {dict(wanted)}")
        for row in rows:
            if row.status != "delivered" or not world.truth.sent[row.webhook_id]:
                world.truth.violated(f"webhook {row.webhook_id} ({row.event_type}) is {row.status}")
