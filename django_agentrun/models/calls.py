"""Turns and their tool calls."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django_fsm import FSMField, FSMModelMixin

from ..content import ResultFormat, render_result
from ..fields import json_field
from ..states import (
    TOOL_CALL_CLOSED,
    TOOL_CALL_TRANSITIONS,
    TURN_TRANSITIONS,
    ResultSource,
    SideEffect,
    ToolCallState,
    TurnState,
)
from .base import UsageCounts, transition_to, width
from .recorded import Recorded, RecordedField, RecordedManager, RecordedQuerySet, filled_from
from .runs import Run


class Turn(FSMModelMixin, UsageCounts):
    """One model request/response and the tool calls it asked for."""

    # No index of its own: the unique (run, index) leads with it.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="turns", db_index=False)
    index = models.PositiveIntegerField()
    state = FSMField(
        default=TurnState.RUNNING,
        choices=TurnState.choices,
        max_length=width(TurnState),
        protected=True,
    )
    is_final = models.BooleanField(
        default=False, help_text="The last allowed turn: final notice sent, no tools offered."
    )
    content = RecordedField(
        null=True,
        blank=True,
        seq_field="content_seq",
        help_text="The assistant content blocks, as the API returned them (in the column only "
        "on rows no event holds them for: content_seq).",
    )
    content_seq = models.IntegerField(
        null=True,
        blank=True,
        help_text="The seq of the model_response event whose content this is (models/recorded.py).",
    )
    message_id = models.CharField(max_length=200, blank=True)
    request_id = models.CharField(max_length=200, blank=True)
    model = models.CharField(max_length=200, blank=True)
    stop_reason = models.CharField(max_length=64, blank=True)
    model_attempts = models.PositiveIntegerField(default=0)
    usage_details = json_field(
        default=dict,
        blank=True,
        help_text="The usage's nested parts as returned: server_tool_use, cache_creation.",
    )
    prefix = models.CharField(
        max_length=64,
        blank=True,
        help_text="SHA-256 of the model, system, tools and messages this answer was written "
        "after (kept where it has thinking blocks: engine/history.py keep_valid_thinking).",
    )
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    RECORDED = (Recorded("content", "content_seq", "content"),)
    recorded_content = filled_from(RECORDED[0])

    objects = RecordedManager()

    class Meta:
        ordering = ["run", "index"]
        base_manager_name = "objects"
        constraints = [
            models.UniqueConstraint(fields=["run", "index"], name="agentrun_turn_run_index"),
        ]
        indexes = [
            # The admin overview's latency (admin/overview_data.py), index-only: entries for
            # completed turns only, added by the write that completes one.
            models.Index(
                fields=["finished_at", "started_at", "model"],
                condition=Q(state=TurnState.COMPLETED),
                name="agentrun_turn_finished_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"turn {self.index} of {self.run_id} ({self.state})"

    def recorded_usage(self) -> dict[str, Any]:
        """The four counters and the nested details, as the response's usage had them."""
        return {**self.usage(), **(self.usage_details or {})}

    to_awaiting_tool = transition_to(state, TURN_TRANSITIONS, TurnState.AWAITING_TOOL)
    to_completed = transition_to(state, TURN_TRANSITIONS, TurnState.COMPLETED)
    to_cancelled = transition_to(state, TURN_TRANSITIONS, TurnState.CANCELLED)
    to_failed = transition_to(state, TURN_TRANSITIONS, TurnState.FAILED)


class ToolCallQuerySet(RecordedQuerySet):
    def open(self) -> ToolCallQuerySet:
        return self.exclude(state__in=TOOL_CALL_CLOSED)

    def pending_decision(self) -> ToolCallQuerySet:
        """Calls waiting for a person: approvals and unknown outcomes."""
        return self.filter(state__in=[ToolCallState.AWAITING_APPROVAL, ToolCallState.UNKNOWN])

    def approval_expired(self, now=None) -> ToolCallQuerySet:
        now = now or timezone.now()
        return self.filter(state=ToolCallState.AWAITING_APPROVAL, approval_deadline__lt=now)


class ToolCallManager(RecordedManager.from_queryset(ToolCallQuerySet)):  # type: ignore[misc]
    """Calls with their results (RECORDED), and ToolCallQuerySet's finders."""


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
        max_length=width(SideEffect), choices=SideEffect.choices, default=SideEffect.READ_ONLY
    )
    idempotency_key = models.CharField(max_length=64)
    state = FSMField(
        default=ToolCallState.REQUESTED,
        choices=ToolCallState.choices,
        max_length=width(ToolCallState),
        protected=True,
    )
    attempt = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    result = RecordedField(
        null=True,
        blank=True,
        seq_field="result_seq",
        help_text="The result: a JSON value, or content blocks (result_format); in the column "
        "only on rows no event holds it for (result_seq).",
    )
    result_seq = models.IntegerField(
        null=True,
        blank=True,
        help_text="The seq of the event that recorded the result the call holds now (its "
        "closing, or the last replacement: models/recorded.py).",
    )
    # Rows written before formats existed get "json": a legacy list of dicts renders as text.
    result_format = models.CharField(
        max_length=width(ResultFormat), choices=ResultFormat.choices, default=ResultFormat.JSON
    )
    is_error = models.BooleanField(default=False)
    result_source = models.CharField(
        max_length=width(ResultSource), choices=ResultSource.choices, blank=True
    )
    unknown_reason = models.TextField(blank=True)

    # Approval.
    approved = models.BooleanField(default=False)
    approval_payload = json_field(null=True, blank=True)
    approval_deadline = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,  # a partial index (Meta.indexes): most calls need no person
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_note = models.TextField(blank=True)
    original_arguments = json_field(
        null=True, blank=True, help_text="The model's arguments, when a person edited them."
    )
    created_at = models.DateTimeField(default=timezone.now)

    RECORDED = (Recorded("result", "result_seq", "result"),)
    recorded_result = filled_from(RECORDED[0])

    objects = ToolCallManager()

    class Meta:
        ordering = ["run", "turn_index", "position"]
        base_manager_name = "objects"
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
                fields=["decided_by"],
                condition=Q(decided_by__isnull=False),
                name="agentrun_toolcall_decider_idx",
            ),
            # The admin overview's tool latency, index-only: calls that ran a handler, once
            # closed.
            models.Index(
                fields=["finished_at", "started_at", "name"],
                condition=Q(started_at__isnull=False, finished_at__isnull=False),
                name="agentrun_toolcall_finished_idx",
            ),
            models.Index(
                fields=["approval_deadline"],
                condition=Q(state=ToolCallState.AWAITING_APPROVAL, approval_deadline__isnull=False),
                name="agentrun_toolcall_appr_dl_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.tool_call_id}, {self.state})"

    to_requested = transition_to(state, TOOL_CALL_TRANSITIONS, ToolCallState.REQUESTED)
    to_awaiting_approval = transition_to(
        state, TOOL_CALL_TRANSITIONS, ToolCallState.AWAITING_APPROVAL
    )
    to_in_flight = transition_to(state, TOOL_CALL_TRANSITIONS, ToolCallState.IN_FLIGHT)
    to_unknown = transition_to(state, TOOL_CALL_TRANSITIONS, ToolCallState.UNKNOWN)
    to_succeeded = transition_to(state, TOOL_CALL_TRANSITIONS, ToolCallState.SUCCEEDED)
    to_errored = transition_to(state, TOOL_CALL_TRANSITIONS, ToolCallState.ERRORED)
    to_rejected = transition_to(state, TOOL_CALL_TRANSITIONS, ToolCallState.REJECTED)
    to_skipped = transition_to(state, TOOL_CALL_TRANSITIONS, ToolCallState.SKIPPED)
    to_cancelled = transition_to(state, TOOL_CALL_TRANSITIONS, ToolCallState.CANCELLED)

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
