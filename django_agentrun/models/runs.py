"""The run: its states, usage, lease, and the querysets the reaper and the API use."""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.db import DatabaseError, models
from django.db.models import Case, Exists, OuterRef, Q, Value, When
from django.utils import timezone
from django_fsm import FSMField, FSMModelMixin

from ..fields import json_field
from ..permissions import VIEW_ALL_PERMISSION
from ..states import (
    PHASES_ACTIVE,
    RUN_ACTIVE,
    RUN_PHASE,
    RUN_TRANSITIONS,
    RunPhase,
    RunState,
)
from .base import UsageCounts, transition_to, width


def _earlier_active() -> Any:
    """An active run before the outer one in its conversation (none outside one)."""
    return Run.objects.filter(
        conversation=OuterRef("conversation"),
        conversation_position__lt=OuterRef("conversation_position"),
        state__in=RUN_ACTIVE,
    )


def _phase_of_state() -> Case:
    """Run.phase's expression: RUN_PHASE as SQL (CASE "state" WHEN ... END)."""
    by_phase: dict[str, list[str]] = {}
    for state, phase in RUN_PHASE.items():
        by_phase.setdefault(phase, []).append(state)
    return Case(
        *(
            When(state__in=sorted(states), then=Value(phase))
            for phase, states in sorted(by_phase.items())
            if phase != RunPhase.FINISHED
        ),
        default=Value(RunPhase.FINISHED),
    )


class _PhaseField(models.GeneratedField):
    """Django's GeneratedField whose check does not need the database: Django 6 asks the
    server's version for it (supports_virtual_generated_columns), and `manage.py check
    --database default` failed with OperationalError in a project whose database is not
    made yet, instead of naming what is missing. Migrations see Django's own field."""

    def _check_supported(self, databases):
        try:
            return super()._check_supported(databases)
        except DatabaseError:
            return []  # the database's own checks say it cannot be reached

    def deconstruct(self):
        name, _path, args, kwargs = super().deconstruct()
        return name, "django.db.models.GeneratedField", args, kwargs


class RunQuerySet(models.QuerySet["Run"]):
    # The reaper's selections read Run.phase, not the state: the predicates of their
    # partial indexes are on it (a predicate on the state would make every turn's commit
    # write them, and keep the run's updates from being HOT).
    def active(self) -> RunQuerySet:
        return self.filter(phase__in=PHASES_ACTIVE)

    def leased(self) -> RunQuerySet:
        return self.filter(phase=RunPhase.LEASED)

    def lease_expired(self, now=None) -> RunQuerySet:
        """Runs a worker was advancing whose lease ran out (the worker died or hung)."""
        now = now or timezone.now()
        return self.leased().filter(lease_expires_at__lt=now)

    def queued_stale(self, before) -> RunQuerySet:
        """Queued runs nobody claimed since `before` (their message was lost)."""
        return self.filter(phase=RunPhase.QUEUED, queued_at__lt=before)

    def past_deadline(self, now=None) -> RunQuerySet:
        now = now or timezone.now()
        return self.active().filter(deadline__lt=now)

    def waiting_for_earlier(self) -> RunQuerySet:
        """Runs of a conversation that may not start yet: an earlier run of it is active."""
        return self.filter(Exists(_earlier_active()))

    def startable(self) -> RunQuerySet:
        """Runs no earlier run of their conversation holds back (every run outside one)."""
        return self.filter(~Exists(_earlier_active()))

    def awaiting_approval(self) -> RunQuerySet:
        return self.filter(phase=RunPhase.PARKED)

    def cancel_pending(self) -> RunQuerySet:
        """Runs parked for a person whose cancel was requested as they parked and never
        applied (the worker that saw it died first): the reaper applies it."""
        return self.awaiting_approval().filter(cancel_requested_at__isnull=False)

    def visible_to(self, user) -> RunQuerySet:
        """Runs `user` may see: their own, or all of them with the view permission."""
        if user.is_superuser or user.has_perm(VIEW_ALL_PERMISSION):
            return self
        return self.filter(owner=user)


class Run(FSMModelMixin, UsageCounts):
    """One durable agent run."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Indexed in Meta.indexes (a plain index: no LIKE pattern index beside it).
    agent = models.CharField(max_length=200)
    state = FSMField(
        default=RunState.QUEUED,
        choices=RunState.choices,
        max_length=width(RunState),
        protected=True,
    )
    # The reaper's class of the state (RunPhase, states.RUN_PHASE): what the partial
    # indexes below select by. It changes when a run is claimed, parks, resumes or ends,
    # never between running and awaiting_tool, so a turn's commit changes no indexed
    # column and its update is HOT. Computed by the database: on SQLite a stored generated
    # column; on Postgres a plain column that a trigger keeps (migration 0019_run_phase:
    # adding a generated column there rewrites the table under an exclusive lock), so every
    # write (the ORM, the store's statements, the write function, bulk updates) gets it.
    # Read it from the database: an instance's value is the one it was loaded (or
    # created) with.
    phase = _PhaseField(
        expression=_phase_of_state(),
        output_field=models.CharField(max_length=width(RunPhase), choices=RunPhase.choices),
        db_persist=True,
    )
    input = json_field(help_text="The initial user input: a string or content blocks.")
    config = json_field(
        default=dict, help_text="Snapshot of the agent's configuration when the run was created."
    )
    correlation_id = models.CharField(max_length=200, blank=True)
    # The W3C trace context (traceparent, tracestate) of the run's first span: every later
    # piece of work on the run joins that trace (telemetry.py). {} without an SDK.
    trace_context = models.JSONField(default=dict, blank=True, editable=False)
    # Indexed by agentrun_run_owner_idx (owner, -created_at), which serves its lookups too.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="agent_runs",
        db_index=False,
    )
    metadata = json_field(default=dict, blank=True)
    # The fair-share key, named when the run is created (agents.share_key: its agent's
    # fair_share_key, AGENTRUN_FAIR_SHARE_KEY, or its owner): the governor shares the rate
    # limit across it, and AGENTRUN_MAX_RUNS_PER_KEY caps the runs of one key worked at once.
    # Not indexed: a cap counts among the leased runs (agentrun_run_ph_leased_idx).
    share_key = models.CharField(max_length=200, blank=True, default="", editable=False)
    # NULL, not "": runs without a key must not collide in the unique constraints.
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    # A digest of what the request with that key asked for: a replay asking for something
    # else is refused ("" for runs started before it was kept: their agent and input decide).
    request_hash = models.CharField(max_length=64, blank=True, default="")

    # Usage totals (UsageCounts), counted once per recorded response.
    cost_usd = models.DecimalField(max_digits=14, decimal_places=6, default=0)
    turn_count = models.PositiveIntegerField(default=0)

    output = json_field(null=True, blank=True)
    parsed_output = json_field(
        null=True,
        blank=True,
        help_text="With structured output (an Agent's output_format): the final answer, "
        "parsed and validated against the schema.",
    )
    stop_reason = models.CharField(max_length=64, blank=True)
    error_code = models.CharField(max_length=64, blank=True)
    error_message = models.TextField(blank=True)
    failure_phase = models.CharField(max_length=32, blank=True)
    last_checkpoint = models.PositiveIntegerField(
        null=True, blank=True, help_text="Event seq of the last checkpoint before the failure."
    )

    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancel_reason = models.TextField(blank=True)
    cancel_requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,  # a partial index (Meta.indexes): most runs have none
    )
    deadline = models.DateTimeField(null=True, blank=True)

    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    lease_epoch = models.BigIntegerField(default=0)
    recovery_attempts = models.PositiveIntegerField(default=0)
    last_seq = models.PositiveIntegerField(default=0, help_text="Seq of the newest event.")

    # A fork (services.fork_run) starts from a copy of another run's first turns.
    forked_from = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="forks",
        help_text="The run this one was forked from.",
        db_index=False,  # a partial index (Meta.indexes): most runs are no fork
    )
    forked_at_turn = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="The turn of the original this run asked the model again (its turns "
        "before it are copies).",
    )

    # A run of a conversation (services.send_message): its history starts with the earlier
    # runs' (the engine reads them at the claim), and it starts once they have all ended.
    conversation = models.ForeignKey(
        "Conversation",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="runs",
        db_index=False,  # the unique (conversation, position) leads with it
        help_text="The conversation this run answers a message of.",
    )
    conversation_position = models.PositiveIntegerField(
        null=True, blank=True, help_text="The run's place in its conversation (0 first)."
    )
    context = models.TextField(
        blank=True,
        help_text="Per-message context (a date, a user's mode), sent as a text block after "
        "the input in the same user message, never in the system prompt.",
    )
    rolled_back = models.BooleanField(
        default=False,
        help_text="A later message of its conversation rolled it back: its turns are left out "
        "of the conversation's history (what it did stays in its events).",
    )

    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(default=timezone.now)
    queued_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = RunQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        permissions = [
            ("cancel_run", "Can cancel and resume agent runs"),
            ("start_run", "Can start runs of agents through the API"),
            ("view_all_runs", "Can view every agent run, not only their own"),
            ("view_overview", "Can view the overview of agent runs (charts)"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False, owner__isnull=False),
                name="agentrun_run_owner_idem_key",
            ),
            models.UniqueConstraint(
                fields=["idempotency_key"],
                condition=Q(idempotency_key__isnull=False, owner__isnull=True),
                name="agentrun_run_anon_idem_key",
            ),
            # Also the index the claim's and the reaper's "an earlier run is active" use.
            models.UniqueConstraint(
                fields=["conversation", "conversation_position"],
                name="agentrun_run_conversation_position",
            ),
        ]
        # Every index here is written when a run is created, and again only when a column
        # it holds (or its predicate reads) changes: none changes at a turn's commit (the
        # phase and not the state in the predicates; the overview's figures read from the
        # rows, not kept in index keys), so those updates are HOT and write no index entry.
        # Beside each, the query that needs it. (The primary key, the unique constraints
        # above: a run by its id, an idempotency key's replay, a conversation's runs.)
        indexes = [
            # The reaper's scans, each with its own partial index on Run.phase. The leased
            # runs' is on a column no update changes, not on lease_expires_at: a claim, a
            # renewal or a release changes only unindexed columns (the scan reads the
            # leased runs' entries and filters them by their lease). Also the caps' count
            # of the runs worked now (queries.sql worked_by_agent, worked_by_share_key).
            models.Index(
                fields=["created_at"],
                condition=Q(phase=RunPhase.LEASED),
                name="agentrun_run_ph_leased_idx",
            ),
            # The reaper's lost wake-ups (RunQuerySet.queued_stale), and the queued run that
            # waited longest under a cap (store/caps.next_waiting).
            models.Index(
                fields=["queued_at"],
                condition=Q(phase=RunPhase.QUEUED),
                name="agentrun_run_ph_queued_idx",
            ),
            # The reaper's runs past their deadline (RunQuerySet.past_deadline).
            models.Index(
                fields=["deadline"],
                condition=Q(phase__in=PHASES_ACTIVE, deadline__isnull=False),
                name="agentrun_run_ph_deadline_idx",
            ),
            # The reaper's pending cancels (RunQuerySet.cancel_pending): a run parked for a
            # person with a cancel pending (its worker died between the park and the cancel
            # it saw there): empty but for that instant.
            models.Index(
                fields=["cancel_requested_at"],
                condition=Q(phase=RunPhase.PARKED, cancel_requested_at__isnull=False),
                name="agentrun_run_ph_cancel_idx",
            ),
            # The API's and the admin's lists of a user's runs, newest first (visible_to).
            models.Index(fields=["owner", "-created_at"], name="agentrun_run_owner_idx"),
            # The API's `agent` filter (GET /runs?agent=) and the admin's. Plain indexes (no
            # LIKE pattern twins), partial ones for columns that are mostly NULL. (No index
            # on correlation_id: no query looks a run up by it; the admin's search is a
            # substring match, which a B-tree cannot serve.)
            models.Index(fields=["agent"], name="agentrun_run_agent_idx"),
            # Deleting a user (cancel_requested_by's SET NULL looks for their cancels).
            models.Index(
                fields=["cancel_requested_by"],
                condition=Q(cancel_requested_by__isnull=False),
                name="agentrun_run_cancelled_by_idx",
            ),
            # The admin overview's window scans (admin/overview_data.py): the runs that
            # finished in a window, their figures read from their rows. A run gets its entry
            # when it finishes; no write of an active run touches it (the figures were keys
            # of it once, and each turn's cost and tokens wrote it).
            models.Index(
                fields=["finished_at"],
                condition=Q(finished_at__isnull=False),
                name="agentrun_run_finished_at_idx",
            ),
            # Deleting a run (forked_from's SET NULL looks for its forks).
            models.Index(
                fields=["forked_from"],
                condition=Q(forked_from__isnull=False),
                name="agentrun_run_forked_from_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.agent} run {self.id} ({self.state})"

    # Transitions: one per target state, sources from RUN_TRANSITIONS.
    to_queued = transition_to(state, RUN_TRANSITIONS, RunState.QUEUED)
    to_running = transition_to(state, RUN_TRANSITIONS, RunState.RUNNING)
    to_awaiting_tool = transition_to(state, RUN_TRANSITIONS, RunState.AWAITING_TOOL)
    to_awaiting_approval = transition_to(state, RUN_TRANSITIONS, RunState.AWAITING_APPROVAL)
    to_completed = transition_to(state, RUN_TRANSITIONS, RunState.COMPLETED)
    to_failed = transition_to(state, RUN_TRANSITIONS, RunState.FAILED)
    to_cancelled = transition_to(state, RUN_TRANSITIONS, RunState.CANCELLED)
    to_timed_out = transition_to(state, RUN_TRANSITIONS, RunState.TIMED_OUT)

    @property
    def is_active(self) -> bool:
        return self.state in RUN_ACTIVE
