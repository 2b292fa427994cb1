"""Runs, turns, tool calls and the append-only event log.

State fields are django-fsm-2 `FSMField(protected=True)`: transitions change
state in memory (one method per target state, generated from `states.py`), and
`services.py` persists them with a compare-and-set UPDATE in the same
transaction as the events that record them.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django_fsm import FSMField, FSMModelMixin, transition

from .clients.base import USAGE_KEYS
from .content import ResultFormat, render_result
from .exceptions import AppendOnlyError
from .fields import json_field
from .states import (
    RUN_ACTIVE,
    RUN_TRANSITIONS,
    TOOL_CALL_CLOSED,
    TOOL_CALL_TRANSITIONS,
    TURN_TRANSITIONS,
    ResultSource,
    RunState,
    SideEffect,
    ToolCallState,
    TurnState,
    sources_of,
)


def _width(choices: type[models.TextChoices]) -> int:
    return max(len(value) for value in choices.values)


def _to(field: FSMField, table: dict[str, frozenset[str]], target: str) -> Any:
    """The django-fsm transition to `target`, its sources read from `table` (states.py).

    It changes the state in memory only; services.py persists it with its events."""

    def method(self: Any) -> None:
        pass

    method.__name__ = method.__qualname__ = f"to_{target}"
    method.__doc__ = f"Move to {target!r} (in memory; saved by services)."
    return transition(field=field, source=sources_of(table, target), target=target)(method)


def idempotency_key_for(run_id: uuid.UUID | str, tool_call_id: str) -> str:
    """sha256(run_id + tool_call_id), hex: the key a tool passes to the outside world."""
    return hashlib.sha256(f"{run_id}{tool_call_id}".encode()).hexdigest()


class RunQuerySet(models.QuerySet["Run"]):
    def active(self) -> RunQuerySet:
        return self.filter(state__in=RUN_ACTIVE)

    def leased(self) -> RunQuerySet:
        return self.filter(state__in=[RunState.RUNNING, RunState.AWAITING_TOOL])

    def lease_expired(self, now=None) -> RunQuerySet:
        """Runs a worker was advancing whose lease ran out (the worker died or hung)."""
        now = now or timezone.now()
        return self.leased().filter(lease_expires_at__lt=now)

    def queued_stale(self, before) -> RunQuerySet:
        """Queued runs nobody claimed since `before` (their message was lost)."""
        return self.filter(state=RunState.QUEUED, queued_at__lt=before)

    def past_deadline(self, now=None) -> RunQuerySet:
        now = now or timezone.now()
        return self.active().filter(deadline__lt=now)

    def awaiting_approval(self) -> RunQuerySet:
        return self.filter(state=RunState.AWAITING_APPROVAL)

    def visible_to(self, user) -> RunQuerySet:
        """Runs `user` may see: their own, or all of them with the view permission."""
        if user.is_superuser or user.has_perm("agentrun.view_all_runs"):
            return self
        return self.filter(owner=user)


class UsageCounts(models.Model):
    """The four token counters, named like the API's usage keys."""

    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    cache_creation_input_tokens = models.BigIntegerField(default=0)
    cache_read_input_tokens = models.BigIntegerField(default=0)

    class Meta:
        abstract = True

    def usage(self) -> dict[str, int]:
        return {key: getattr(self, key) for key in USAGE_KEYS}


class Run(FSMModelMixin, UsageCounts):
    """One durable agent run."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent = models.CharField(max_length=200, db_index=True)
    state = FSMField(
        default=RunState.QUEUED,
        choices=RunState.choices,
        max_length=_width(RunState),
        protected=True,
    )
    input = json_field(help_text="The initial user input: a string or content blocks.")
    config = json_field(
        default=dict, help_text="Snapshot of the agent's configuration when the run was created."
    )
    correlation_id = models.CharField(max_length=200, blank=True, db_index=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="agent_runs",
    )
    metadata = json_field(default=dict, blank=True)
    # NULL, not "": runs without a key must not collide in the unique constraints.
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001

    # Usage totals (UsageCounts), counted once per recorded response.
    cost_usd = models.DecimalField(max_digits=14, decimal_places=6, default=0)
    turn_count = models.PositiveIntegerField(default=0)

    output = json_field(null=True, blank=True)
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
    )
    deadline = models.DateTimeField(null=True, blank=True)

    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    lease_epoch = models.BigIntegerField(default=0)
    recovery_attempts = models.PositiveIntegerField(default=0)
    last_seq = models.PositiveIntegerField(default=0, help_text="Seq of the newest event.")

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
            ("view_all_runs", "Can view every agent run, not only their own"),
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
        ]
        indexes = [
            # The reaper's hot queries, each with its own partial index.
            models.Index(
                fields=["lease_expires_at"],
                condition=Q(state__in=[RunState.RUNNING, RunState.AWAITING_TOOL]),
                name="agentrun_run_leased_idx",
            ),
            models.Index(
                fields=["queued_at"],
                condition=Q(state=RunState.QUEUED),
                name="agentrun_run_queued_idx",
            ),
            models.Index(
                fields=["deadline"],
                condition=Q(state__in=sorted(RUN_ACTIVE), deadline__isnull=False),
                name="agentrun_run_deadline_idx",
            ),
            models.Index(fields=["owner", "-created_at"], name="agentrun_run_owner_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.agent} run {self.id} ({self.state})"

    # Transitions: one per target state, sources from RUN_TRANSITIONS.
    to_queued = _to(state, RUN_TRANSITIONS, RunState.QUEUED)
    to_running = _to(state, RUN_TRANSITIONS, RunState.RUNNING)
    to_awaiting_tool = _to(state, RUN_TRANSITIONS, RunState.AWAITING_TOOL)
    to_awaiting_approval = _to(state, RUN_TRANSITIONS, RunState.AWAITING_APPROVAL)
    to_completed = _to(state, RUN_TRANSITIONS, RunState.COMPLETED)
    to_failed = _to(state, RUN_TRANSITIONS, RunState.FAILED)
    to_cancelled = _to(state, RUN_TRANSITIONS, RunState.CANCELLED)
    to_timed_out = _to(state, RUN_TRANSITIONS, RunState.TIMED_OUT)

    @property
    def is_active(self) -> bool:
        return self.state in RUN_ACTIVE


class Turn(FSMModelMixin, UsageCounts):
    """One model request/response and the tool calls it asked for."""

    # No index of its own: the unique (run, index) leads with it.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="turns", db_index=False)
    index = models.PositiveIntegerField()
    state = FSMField(
        default=TurnState.RUNNING,
        choices=TurnState.choices,
        max_length=_width(TurnState),
        protected=True,
    )
    is_final = models.BooleanField(
        default=False, help_text="The last allowed turn: final notice sent, no tools offered."
    )
    content = json_field(
        null=True, blank=True, help_text="The assistant content blocks, as the API returned them."
    )
    message_id = models.CharField(max_length=200, blank=True)
    request_id = models.CharField(max_length=200, blank=True)
    model = models.CharField(max_length=200, blank=True)
    stop_reason = models.CharField(max_length=64, blank=True)
    model_attempts = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "index"]
        constraints = [
            models.UniqueConstraint(fields=["run", "index"], name="agentrun_turn_run_index"),
        ]

    def __str__(self) -> str:
        return f"turn {self.index} of {self.run_id} ({self.state})"

    to_awaiting_tool = _to(state, TURN_TRANSITIONS, TurnState.AWAITING_TOOL)
    to_completed = _to(state, TURN_TRANSITIONS, TurnState.COMPLETED)
    to_cancelled = _to(state, TURN_TRANSITIONS, TurnState.CANCELLED)
    to_failed = _to(state, TURN_TRANSITIONS, TurnState.FAILED)


class ToolCallQuerySet(models.QuerySet["ToolCall"]):
    def open(self) -> ToolCallQuerySet:
        return self.exclude(state__in=TOOL_CALL_CLOSED)

    def pending_decision(self) -> ToolCallQuerySet:
        """Calls waiting for a person: approvals and unknown outcomes."""
        return self.filter(state__in=[ToolCallState.AWAITING_APPROVAL, ToolCallState.UNKNOWN])

    def approval_expired(self, now=None) -> ToolCallQuerySet:
        now = now or timezone.now()
        return self.filter(state=ToolCallState.AWAITING_APPROVAL, approval_deadline__lt=now)


class ToolCall(FSMModelMixin, models.Model):
    """One tool_use block of a turn, its execution and its tool_result."""

    # No index of its own: the unique (run, turn_index, tool_call_id) leads with it.
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="tool_calls", db_index=False
    )
    turn = models.ForeignKey(Turn, on_delete=models.CASCADE, related_name="tool_calls")
    turn_index = models.PositiveIntegerField()
    tool_call_id = models.CharField(
        max_length=200, help_text="The model's tool_use id (toolu_...)."
    )
    position = models.PositiveIntegerField()
    name = models.CharField(max_length=200)
    arguments = json_field(default=dict, help_text="Canonical arguments (as validated).")
    arguments_hash = models.CharField(max_length=64)
    side_effect = models.CharField(
        max_length=_width(SideEffect), choices=SideEffect.choices, default=SideEffect.READ_ONLY
    )
    idempotency_key = models.CharField(max_length=64)
    state = FSMField(
        default=ToolCallState.REQUESTED,
        choices=ToolCallState.choices,
        max_length=_width(ToolCallState),
        protected=True,
    )
    attempt = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    result = json_field(
        null=True,
        blank=True,
        help_text="The result: a JSON value, or content blocks (result_format).",
    )
    # Rows written before formats existed get "json": a legacy list of dicts renders as text.
    result_format = models.CharField(
        max_length=_width(ResultFormat), choices=ResultFormat.choices, default=ResultFormat.JSON
    )
    is_error = models.BooleanField(default=False)
    result_source = models.CharField(
        max_length=_width(ResultSource), choices=ResultSource.choices, blank=True
    )
    unknown_reason = models.TextField(blank=True)

    # Approval.
    approved = models.BooleanField(default=False)
    approval_payload = json_field(null=True, blank=True)
    approval_deadline = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_note = models.TextField(blank=True)
    original_arguments = json_field(
        null=True, blank=True, help_text="The model's arguments, when a person edited them."
    )
    created_at = models.DateTimeField(default=timezone.now)

    objects = ToolCallQuerySet.as_manager()

    class Meta:
        ordering = ["run", "turn_index", "position"]
        permissions = [("approve_toolcall", "Can approve, reject and resolve tool calls")]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "turn_index", "tool_call_id"], name="agentrun_toolcall_key"
            ),
        ]
        indexes = [
            models.Index(
                fields=["created_at"],
                condition=Q(state__in=[ToolCallState.AWAITING_APPROVAL, ToolCallState.UNKNOWN]),
                name="agentrun_toolcall_pending_idx",
            ),
            models.Index(
                fields=["approval_deadline"],
                condition=Q(state=ToolCallState.AWAITING_APPROVAL, approval_deadline__isnull=False),
                name="agentrun_toolcall_appr_dl_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.tool_call_id}, {self.state})"

    to_requested = _to(state, TOOL_CALL_TRANSITIONS, ToolCallState.REQUESTED)
    to_awaiting_approval = _to(state, TOOL_CALL_TRANSITIONS, ToolCallState.AWAITING_APPROVAL)
    to_in_flight = _to(state, TOOL_CALL_TRANSITIONS, ToolCallState.IN_FLIGHT)
    to_unknown = _to(state, TOOL_CALL_TRANSITIONS, ToolCallState.UNKNOWN)
    to_succeeded = _to(state, TOOL_CALL_TRANSITIONS, ToolCallState.SUCCEEDED)
    to_errored = _to(state, TOOL_CALL_TRANSITIONS, ToolCallState.ERRORED)
    to_rejected = _to(state, TOOL_CALL_TRANSITIONS, ToolCallState.REJECTED)
    to_skipped = _to(state, TOOL_CALL_TRANSITIONS, ToolCallState.SKIPPED)
    to_cancelled = _to(state, TOOL_CALL_TRANSITIONS, ToolCallState.CANCELLED)

    @property
    def is_closed(self) -> bool:
        return self.state in TOOL_CALL_CLOSED

    def tool_result_block(self) -> dict[str, Any]:
        """The tool_result block this call contributes to the next user message."""
        block: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": self.tool_call_id,
            "content": render_result(self.result, self.result_format),
        }
        if self.is_error:
            block["is_error"] = True
        return block


class RunEventQuerySet(models.QuerySet["RunEvent"]):
    def bulk_create(self, objs, *args: Any, **kwargs: Any):
        if kwargs.get("update_conflicts") or kwargs.get("ignore_conflicts"):
            raise AppendOnlyError("Run events are append-only: bulk_create cannot upsert or skip.")
        return super().bulk_create(objs, *args, **kwargs)

    def bulk_update(self, *args: Any, **kwargs: Any) -> int:
        raise AppendOnlyError("Run events are append-only: bulk_update() is refused.")

    def update_or_create(self, *args: Any, **kwargs: Any):
        raise AppendOnlyError("Run events are append-only: update_or_create() is refused.")

    def update(self, **kwargs: Any) -> int:
        raise AppendOnlyError("Run events are append-only: QuerySet.update() is refused.")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError("Run events are append-only: QuerySet.delete() is refused.")


class RunEvent(models.Model):
    """One entry of a run's append-only history; `seq` is gap-free per run."""

    # No index of its own: the unique (run, seq) leads with it.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events", db_index=False)
    seq = models.PositiveIntegerField()
    type = models.CharField(max_length=64)
    payload = json_field(default=dict)
    created_at = models.DateTimeField(default=timezone.now)

    objects = RunEventQuerySet.as_manager()

    class Meta:
        ordering = ["run", "seq"]
        base_manager_name = "objects"
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="agentrun_runevent_seq"),
        ]

    def __str__(self) -> str:
        return f"#{self.seq} {self.type}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding or kwargs.get("force_update") or kwargs.get("update_fields"):
            raise AppendOnlyError(
                f"Run event #{self.seq} cannot be changed: events are append-only."
            )
        # Always an INSERT: a new instance carrying an existing pk fails instead of overwriting.
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any):
        raise AppendOnlyError(f"Run event #{self.seq} cannot be deleted: events are append-only.")
