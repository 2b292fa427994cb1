"""manage.py reconcile_runs: run the reaper's recovery once, by hand."""

from __future__ import annotations

import argparse
import math
import uuid

from django.core.management.base import BaseCommand, CommandError

from django_agentrun.conf import agentrun_settings
from django_agentrun.models import Run
from django_agentrun.reaper import reap
from django_agentrun.store import database_now


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not math.isfinite(seconds):
        raise argparse.ArgumentTypeError(f"{value!r} is not a finite number of seconds")
    if seconds < 0:
        raise argparse.ArgumentTypeError("seconds must not be negative")
    return seconds


def _run_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a run id (a UUID)") from None


class Command(BaseCommand):
    help = (
        "Find runs nobody is advancing (dead workers, lost messages, passed deadlines, stale "
        "in-flight tool calls) and repair them, exactly as the beat-scheduled reaper does."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--dry-run", action="store_true", help="Say what would be done; change nothing."
        )
        parser.add_argument(
            "--run",
            dest="runs",
            action="append",
            type=_run_id,
            default=None,
            metavar="ID",
            help="Only this run (repeatable).",
        )
        parser.add_argument(
            "--stale-after",
            type=_seconds,
            default=None,
            metavar="SECONDS",
            help=(
                "Re-enqueue runs nobody picked up for this long "
                f"(default: AGENTRUN_QUEUED_STALE_SECONDS, now {agentrun_settings.QUEUED_STALE_SECONDS:g})."
            ),
        )

    def handle(
        self, *, dry_run: bool, runs: list[uuid.UUID] | None, stale_after: float | None, **options
    ) -> None:
        if runs:
            found = set(Run.objects.filter(pk__in=runs).values_list("pk", flat=True))
            missing = [str(pk) for pk in runs if pk not in found]
            if missing:
                raise CommandError(f"No run with id {', '.join(missing)}.")
        report = reap(dry_run=dry_run, run_ids=runs, stale_after=stale_after)
        prefix = "Would" if dry_run else "Did"
        for finding in report.findings:
            status = (
                "ERROR " + finding.error
                if finding.error
                else (finding.detail if finding.done or dry_run else "")
            )
            self.stdout.write(f"{finding.run_id}  {finding.kind:<20} {status}")
        if runs:
            self._leased(runs, {finding.run_id for finding in report.findings})
        if not report.findings:
            self.stdout.write("Nothing to reconcile.")
        else:
            counts = ", ".join(f"{n} {kind}" for kind, n in report.as_dict()["counts"].items())
            self.stdout.write(f"{prefix}: {counts}.")
        if report.errors:
            raise CommandError(f"{len(report.errors)} run(s) could not be reconciled; see above.")

    def _leased(self, runs: list[uuid.UUID], found: set) -> None:
        """Say which of `runs` a worker's lease still covers: the reaper leaves those alone
        until it runs out (a dead worker's lease too)."""
        now = database_now()
        leased = Run.objects.filter(pk__in=runs, lease_expires_at__gt=now).exclude(lease_owner="")
        for run in leased.order_by("lease_expires_at"):
            if run.pk in found or str(run.pk) in found:
                continue
            left = (run.lease_expires_at - now).total_seconds()
            self.stdout.write(
                f"Run {run.pk} is leased by {run.lease_owner} until "
                f"{run.lease_expires_at.isoformat(timespec='seconds')} ({left:.0f} s); the "
                "reaper takes it back after that."
            )
