"""The reaper: finds runs nobody is advancing and repairs them.

Run by the beat-scheduled `django_agentrun.reap` task and by `manage.py
reconcile_runs` (the same code). Each finding is handled in its own short
transaction, rows picked with `SELECT ... FOR UPDATE SKIP LOCKED` where the
database has it, so two reapers at once never act on the same run twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q

from . import store, transitions, wakeups
from .conf import agentrun_settings
from .engine import settle_in_flight
from .identity import worker_identity
from .models import Run, ToolCall
from .states import RunState, ToolCallState

logger = logging.getLogger(__name__)


@dataclass
class Finding:
    run_id: str
    kind: str
    detail: str = ""
    done: bool = False
    error: str = ""


@dataclass
class ReapReport:
    findings: list[Finding] = field(default_factory=list)
    dry_run: bool = False

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.error]

    def as_dict(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for finding in self.findings:
            counts[finding.kind] = counts.get(finding.kind, 0) + 1
        return {"dry_run": self.dry_run, "counts": counts, "errors": len(self.errors)}


KINDS = {
    "deadline": "past its deadline: time it out",
    "approval_deadline": "approval past its deadline: time the run out",
    "lease_expired": "its worker died (lease expired): recover in-flight calls, re-enqueue",
    "recovery_exhausted": "crashed too often: fail with recovery_exhausted",
    "not_picked_up": "nobody picked it up (message lost): re-enqueue",
    "cancel_pending": "parked with a cancel requested (its worker died before applying it): cancel",
}

# Leases a run may wait for a worker behind a backlog before its wake-up is sent again
# (only where the broker's messages cannot be read: see _lost_wakeups).
BACKLOG_PATIENCE = 10
# Seconds between the two reads of the broker before a run's wake-up counts as lost.
LOOK_AGAIN_SECONDS = 0.25


def reap(
    *,
    now: datetime | None = None,
    dry_run: bool = False,
    run_ids: Iterable[Any] | None = None,
    stale_after: float | None = None,
    batch_size: int | None = None,
) -> ReapReport:
    """Find and repair stuck runs. `stale_after` (seconds) overrides
    AGENTRUN_QUEUED_STALE_SECONDS. Times are the database's (leases are judged by it)."""
    now = now or store.database_now()
    batch = batch_size or agentrun_settings.REAPER_BATCH_SIZE
    stale = timedelta(
        seconds=min(
            agentrun_settings.QUEUED_STALE_SECONDS if stale_after is None else stale_after,
            agentrun_settings.LEASE_SECONDS,
        )
    )
    report = ReapReport(dry_run=dry_run)
    base = Run.objects.all()
    if run_ids is not None:
        base = base.filter(pk__in=list(run_ids))

    # Runs whose deadline passed and that no live worker will notice.
    no_live_lease = Q(lease_owner="") | Q(lease_expires_at__lt=now)
    _each(
        report, dry_run, "deadline", base.past_deadline(now).filter(no_live_lease), batch, _time_out
    )
    _each(report, dry_run, "cancel_pending", base.cancel_pending(), batch, _cancel)
    waiting = ToolCall.objects.approval_expired(now).values("run_id")
    _each(
        report,
        dry_run,
        "approval_deadline",
        base.awaiting_approval().filter(pk__in=waiting),
        batch,
        _time_out_approval,
    )
    cap = agentrun_settings.MAX_RECOVERY_ATTEMPTS
    expired = base.lease_expired(now).exclude(lease_owner="")
    _each(
        report,
        dry_run,
        "recovery_exhausted",
        expired.filter(recovery_attempts__gte=cap),
        batch,
        _exhausted,
    )
    _each(
        report, dry_run, "lease_expired", expired.filter(recovery_attempts__lt=cap), batch, _recover
    )
    _each(report, dry_run, "not_picked_up", _lost_wakeups(base, now, stale), batch, _requeue)
    for finding in report.findings:
        log = logger.error if finding.error else logger.info
        log(
            "Reaper %s run_id=%s %s%s",
            finding.kind,
            finding.run_id,
            "(dry run) " if dry_run else "",
            finding.error or finding.detail,
        )
    return report


def _unclaimed_since(base, before: datetime):
    """Runs waiting for a worker since before `before`: queued, or released (a wake-up
    was sent when the lease was given back). A run of a conversation that an earlier run
    holds back is not waiting for a worker (its claim would refuse it): the transition that
    ends the earlier run wakes it, and once nothing holds it back it is found here."""
    return base.queued_stale(before).startable() | base.leased().filter(
        lease_owner="", lease_expires_at__lt=before
    )


def _lost_wakeups(base, now: datetime, stale: timedelta):
    """Runs whose wake-up was lost (a crash between commit and publish, a broker that lost
    its messages), never runs whose wake-up is merely slow: behind a backlog, held by a busy
    worker, still being published after a big commit. Unclaimed for `stale`, and the broker
    holds no message for it (wakeups.waiting_runs: Redis's queue, delivered messages and the
    wake-ups a commit announced, read twice a moment apart: a message a worker is taking is
    in neither for an instant): lost. A broker that cannot be read is counted instead: while messages wait in
    the queue, a run is re-woken only after waiting BACKLOG_PATIENCE leases."""
    waiting = _unclaimed_since(base, now - stale)
    if not waiting.exists():
        return waiting
    held = wakeups.waiting_runs()
    if held is not None:
        suspects = [pk for pk in waiting.values_list("pk", flat=True) if str(pk) not in held]
        if suspects:
            time.sleep(LOOK_AGAIN_SECONDS)
            again = wakeups.waiting_runs()
            if again is not None:
                suspects = [pk for pk in suspects if str(pk) not in again]
        return waiting.filter(pk__in=suspects)
    backlog = wakeups.queued_messages()
    if not backlog:  # empty, or the broker cannot tell: re-send
        return waiting
    patience = timedelta(seconds=BACKLOG_PATIENCE * agentrun_settings.LEASE_SECONDS)
    logger.debug("Reaper: %s messages wait in the queue; holding back re-sends", backlog)
    return _unclaimed_since(base, now - max(stale, patience))


def _each(report: ReapReport, dry_run: bool, kind: str, qs, batch: int, act) -> None:
    if dry_run:
        for run in qs.order_by("pk")[:batch]:
            report.findings.append(Finding(str(run.pk), kind, KINDS[kind]))
        return
    seen: set[Any] = set()
    while True:
        with transaction.atomic():
            # The runs' rows first (store/locks.py), skipping those a worker or a person
            # holds; each repair then changes that run's turns and calls.
            runs = store.lock_batch(qs.exclude(pk__in=seen).order_by("pk"), batch)
            for run in runs:
                seen.add(run.pk)
                finding = Finding(str(run.pk), kind, KINDS[kind])
                try:
                    with transaction.atomic():
                        finding.detail = act(run) or finding.detail
                        finding.done = True
                except Exception as exc:  # noqa: BLE001 - one bad run must not stop the sweep
                    finding.error = f"{type(exc).__name__}: {exc}"
                report.findings.append(finding)
        if len(runs) < batch:
            return


def _take(run: Run) -> store.Lease:
    return store.take_lease(run, f"reaper:{worker_identity()}")


def _time_out(run: Run) -> str:
    write = store.Write(run, _take(run))
    transitions.stop_run(write, run, RunState.TIMED_OUT, "deadline passed")
    store.send(write)
    return "timed out (run deadline)"


def _time_out_approval(run: Run) -> str:
    write = store.Write(run, _take(run))
    transitions.stop_run(write, run, RunState.TIMED_OUT, "approval deadline passed")
    store.send(write)
    return "timed out (approval deadline)"


def _cancel(run: Run) -> str:
    """A cancel requested as the run parked, which the worker that saw it did not live to
    apply (driver.cancel_parked): nobody holds a parked run, so it applies now."""
    write = store.Write(run)
    transitions.stop_run(write, run, RunState.CANCELLED, run.cancel_reason or "cancelled")
    store.send(write)
    return "cancelled (requested as it parked)"


def _exhausted(run: Run) -> str:
    write = store.Write(run, _take(run))
    transitions.fail_run(
        write,
        run,
        code="recovery_exhausted",
        message=(
            f"The run's worker stopped without finishing its step {run.recovery_attempts + 1} "
            "times (it died, or lost its lease); not retrying again "
            "(AGENTRUN_MAX_RECOVERY_ATTEMPTS)."
        ),
        phase="recovery",
        turn=transitions.open_turn(run),
    )
    store.send(write)
    return "failed: recovery_exhausted"


def _recover(run: Run) -> str:
    """Apply the side-effect policy to stale in_flight calls, then wake a worker."""
    in_flight = list(
        run.tool_calls.filter(state=ToolCallState.IN_FLIGHT).values_list("tool_call_id", flat=True)
    )
    # Reserve the run under our row lock, so a second reaper scanning after we commit no
    # longer sees an expired lease; the engine takes the reservation over (counting the
    # recovery, since the dead holder never released it) after we commit.
    marker = _take(run).owner
    # robust: a failure here is logged and must not abort the rest of the sweep.
    transaction.on_commit(lambda: settle_in_flight(run.pk, steal_from=marker), robust=True)
    return f"re-enqueued; in-flight calls: {', '.join(in_flight) or 'none'}"


def _requeue(run: Run) -> str:
    write = store.Write(run)
    transitions.resend_wakeup(write, run)
    store.send(write)
    return "re-enqueued"
