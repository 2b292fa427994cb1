"""Read-only representations of runs, turns, tool calls and events, and the error body.

Machine-owned internals stay out of every response: leases, the agent config
snapshot, stored approval payloads, and in events all but their type's public keys
(`django_agentrun.events.public_payload`). A fresh approval token is shown only to
users who may decide.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ... import services
from ...events import public_payload, shown_content, thinking_text
from ...events.public import caller_context
from ...models import Run, RunEvent, ToolCall, Turn
from ...permissions import can_decide
from ...runconfig import RunConfig
from ...servertools import server_tool_uses
from ...states import RunState, ToolCallState, TurnState
from .fields import StateField

PENDING_STATES = (ToolCallState.AWAITING_APPROVAL, ToolCallState.UNKNOWN)


class ErrorSerializer(serializers.Serializer):
    """The body of every error the API answers (see `api.errors`)."""

    code = serializers.CharField(help_text="Stable error code, e.g. `not_found`, `invalid`.")
    detail = serializers.CharField(help_text="What went wrong, for people.")
    errors = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text="With code `invalid`: messages per field or query parameter.",
    )


class UsageSerializer(serializers.Serializer):
    input_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()
    cache_creation_input_tokens = serializers.IntegerField()
    cache_read_input_tokens = serializers.IntegerField()


class CancelRequestSerializer(serializers.ModelSerializer):
    requested_at = serializers.DateTimeField(source="cancel_requested_at", allow_null=True)
    reason = serializers.CharField(source="cancel_reason")
    requested_by = serializers.PrimaryKeyRelatedField(
        source="cancel_requested_by", read_only=True, allow_null=True
    )

    class Meta:
        model = Run
        fields = ["requested_at", "reason", "requested_by"]
        read_only_fields = fields


class ToolCallSerializer(serializers.ModelSerializer):
    state = StateField(ToolCallState)
    source = serializers.CharField(source="result_source", help_text="Who produced the result.")

    class Meta:
        model = ToolCall
        fields = [
            "id",
            "run",
            "turn_index",
            "position",
            "tool_call_id",
            "name",
            "side_effect",
            "state",
            "arguments",
            "original_arguments",
            "attempt",
            "result",
            "is_error",
            "source",
            "unknown_reason",
            "approved",
            "approval_deadline",
            "decided_by",
            "decided_at",
            "decision_note",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields


class DecisionResultSerializer(ToolCallSerializer):
    run_state = StateField(RunState, source="run.state", help_text="The run's state afterwards.")

    class Meta(ToolCallSerializer.Meta):
        fields = [*ToolCallSerializer.Meta.fields, "run_state"]
        read_only_fields = fields


class PendingDecisionSerializer(serializers.ModelSerializer):
    """A call waiting for a person, with a fresh token when the user may decide."""

    agent = serializers.CharField(source="run.agent")
    state = StateField(ToolCallState)
    description = serializers.SerializerMethodField()
    token = serializers.SerializerMethodField(
        help_text="Pass it back to approve/reject/resolve; null if you may not decide."
    )

    class Meta:
        model = ToolCall
        fields = [
            "id",
            "run",
            "agent",
            "turn_index",
            "tool_call_id",
            "name",
            "description",
            "side_effect",
            "state",
            "arguments",
            "unknown_reason",
            "approval_deadline",
            "created_at",
            "token",
        ]
        read_only_fields = fields

    @extend_schema_field(OpenApiTypes.STR)
    def get_description(self, call: ToolCall) -> str:
        return services.tool_description(call)

    @extend_schema_field({"type": "string", "nullable": True})
    def get_token(self, call: ToolCall) -> str | None:
        request = self.context.get("request")
        if request is None or not can_decide(request.user):
            return None
        return services.approval_token(call)


# A nested part of a turn's usage: counts by name, null when the response had none.
_NULLABLE_COUNTS = {
    "type": "object",
    "nullable": True,
    "additionalProperties": {"type": "integer"},
}


class TurnUsageSerializer(UsageSerializer):
    """A turn's usage with the nested parts the API returned (absent: none returned)."""

    cache_creation = serializers.SerializerMethodField(
        help_text="Cache writes by TTL: ephemeral_5m_input_tokens, ephemeral_1h_input_tokens."
    )
    server_tool_use = serializers.SerializerMethodField(
        help_text="Requests of the server tools: web_search_requests, web_fetch_requests."
    )

    @extend_schema_field(_NULLABLE_COUNTS)
    def get_cache_creation(self, turn: Turn) -> dict[str, int] | None:
        return (turn.usage_details or {}).get("cache_creation")

    @extend_schema_field(_NULLABLE_COUNTS)
    def get_server_tool_use(self, turn: Turn) -> dict[str, int] | None:
        return (turn.usage_details or {}).get("server_tool_use")


class TurnSerializer(serializers.ModelSerializer):
    state = StateField(TurnState)
    usage = TurnUsageSerializer(source="*", read_only=True)
    tool_calls = ToolCallSerializer(many=True, read_only=True)
    server_tools = serializers.SerializerMethodField(
        help_text="The tools the API ran itself in this turn (web search, code execution...), "
        "each with its result as returned; they are in `content` too, and never tool calls."
    )
    content = serializers.SerializerMethodField(
        help_text="The answer's content blocks; a thinking block's signature and a "
        "redacted_thinking block's data are left out."
    )
    thinking = serializers.SerializerMethodField(
        help_text="The answer's summarized thinking (empty when omitted or redacted)."
    )
    text = serializers.SerializerMethodField(help_text="The answer's text blocks, joined.")

    @extend_schema_field(OpenApiTypes.ANY)
    def get_content(self, turn: Turn) -> Any:
        return shown_content(turn.content)

    @extend_schema_field(OpenApiTypes.STR)
    def get_thinking(self, turn: Turn) -> str:
        return thinking_text(turn.content)

    @extend_schema_field(OpenApiTypes.STR)
    def get_text(self, turn: Turn) -> str:
        return "".join(
            str(b.get("text", "")) for b in turn.content or () if b.get("type") == "text"
        )

    class Meta:
        model = Turn
        fields = [
            "index",
            "state",
            "is_final",
            "model",
            "content",
            "thinking",
            "text",
            "stop_reason",
            "usage",
            "started_at",
            "finished_at",
            "tool_calls",
            "server_tools",
        ]
        read_only_fields = fields

    @extend_schema_field({"type": "array", "items": {"type": "object"}})
    def get_server_tools(self, turn: Turn) -> list[dict[str, Any]]:
        return server_tool_uses(turn.content)


class RunSerializer(serializers.ModelSerializer):
    """A run in a listing."""

    state = StateField(RunState)
    usage = UsageSerializer(source="*", read_only=True)

    class Meta:
        model = Run
        fields = [
            "id",
            "agent",
            "state",
            "owner",
            "correlation_id",
            "metadata",
            "usage",
            "cost_usd",
            "turn_count",
            "stop_reason",
            "error_code",
            "deadline",
            "cancel_requested_at",
            "forked_from",
            "forked_at_turn",
            "conversation",
            "conversation_position",
            "rolled_back",
            "created_at",
            "updated_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields


class RunDetailSerializer(RunSerializer):
    """A run with its turns, tool calls and the decisions it waits for."""

    model = serializers.SerializerMethodField()
    cancel = CancelRequestSerializer(source="*", read_only=True)
    turns = TurnSerializer(many=True, read_only=True)
    pending_decisions = serializers.SerializerMethodField()
    context = serializers.SerializerMethodField(
        help_text="The context the run was started (or its message sent) with; the text of "
        "the agent's own context hook is the author's, like the system prompt, and not shown."
    )
    output = serializers.SerializerMethodField(
        help_text="The final answer: `text`, `content` (thinking shown as in turns) and, for "
        "stop_reason `refusal`, `refusal`: the model that answered, `category`, `explanation`."
    )

    class Meta(RunSerializer.Meta):
        fields = [
            *RunSerializer.Meta.fields,
            "model",
            "idempotency_key",
            "input",
            "context",
            "output",
            "parsed_output",
            "error_message",
            "failure_phase",
            "last_checkpoint",
            "cancel",
            "last_seq",
            "turns",
            "pending_decisions",
        ]
        read_only_fields = fields

    @extend_schema_field({"type": "object", "nullable": True, "additionalProperties": True})
    def get_output(self, run: Run) -> Any:
        if isinstance(run.output, dict) and "content" in run.output:
            return {**run.output, "content": shown_content(run.output["content"])}
        return run.output

    @extend_schema_field(OpenApiTypes.STR)
    def get_context(self, run: Run) -> str:
        hook = run.config.get("context_hook") if isinstance(run.config, dict) else None
        return caller_context(run.context, hook)

    @extend_schema_field(OpenApiTypes.STR)
    def get_model(self, run: Run) -> str:
        return RunConfig.of(run.config).model

    @extend_schema_field(PendingDecisionSerializer(many=True))
    def get_pending_decisions(self, run: Run) -> list[dict[str, Any]]:
        # From the prefetched turns: no query of its own.
        calls = [
            call
            for turn in run.turns.all()
            for call in turn.tool_calls.all()
            if call.state in PENDING_STATES
        ]
        for call in calls:
            call.run = run  # the serializer reads run.agent
        return PendingDecisionSerializer(calls, many=True, context=self.context).data


class RunEventSerializer(serializers.ModelSerializer):
    payload = serializers.SerializerMethodField(
        help_text="The keys of this event type the run detail would show too."
    )

    class Meta:
        model = RunEvent
        fields = ["seq", "type", "payload", "created_at"]
        read_only_fields = fields

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_payload(self, event: RunEvent) -> Any:
        return public_payload(event.type, event.payload)


class RunEventPageSerializer(serializers.Serializer):
    """One page of a run's timeline; poll again with `after=last_seq`."""

    run_state = StateField(RunState)
    last_seq = serializers.IntegerField(
        help_text="Seq of the last event in this page (or `after` when empty): the next `after`."
    )
    next = serializers.URLField(allow_null=True, help_text="The next page, if there is more.")
    results = RunEventSerializer(many=True)
