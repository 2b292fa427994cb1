"""Request bodies (validated here, applied by `services`) and read-only representations.

Nothing here saves a model. Machine-owned internals stay out of every response:
leases, the agent config snapshot, stored approval payloads, and in events all
but their type's public keys (`django_agentrun.events.public_payload`). A fresh
approval token is shown only to users who may decide.
"""

from __future__ import annotations

from typing import Any

from django.db.models import TextChoices
from django.utils import timezone
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.plumbing import ResolvedComponent
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from .. import services
from ..agents import registered_agents
from ..events import public_payload
from ..models import Run, RunEvent, ToolCall, Turn
from ..permissions import can_decide
from ..states import RunState, ToolCallState, TurnState
from .parsers import text_problem

IDEMPOTENCY_HEADER = "Idempotency-Key"
PENDING_STATES = (ToolCallState.AWAITING_APPROVAL, ToolCallState.UNKNOWN)


class StateField(serializers.CharField):
    """A read-only state, shown in the schema as its own enum component (RunState...):
    runs, turns and tool calls all name the field `state`, so enums named after the
    field would collide."""

    def __init__(self, choices: type[TextChoices], **kwargs: Any) -> None:
        self.state_choices = choices
        super().__init__(read_only=True, **kwargs)


class StateFieldExtension(OpenApiSerializerFieldExtension):
    target_class = StateField

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        choices = self.target.state_choices
        component = ResolvedComponent(
            name=choices.__name__,
            type=ResolvedComponent.SCHEMA,
            object=choices,
            schema={"type": "string", "enum": list(choices.values)},
        )
        auto_schema.registry.register_on_missing(component)
        return component.ref


def _storable(value: str) -> None:
    problem = text_problem(value)
    if problem is not None:
        raise serializers.ValidationError(problem)


class StorableCharField(serializers.CharField):
    """A request's text field: it goes to a text column, which cannot hold NUL or unpaired
    surrogates on every database (JSON fields can: docs/durability.md)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.validators.append(_storable)


class ErrorSerializer(serializers.Serializer):
    """The body of every error the API answers (see `api.errors`)."""

    code = serializers.CharField(help_text="Stable error code, e.g. `not_found`, `invalid`.")
    detail = serializers.CharField(help_text="What went wrong, for people.")
    errors = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text="With code `invalid`: messages per field or query parameter.",
    )


@extend_schema_field(OpenApiTypes.OBJECT)
class ObjectField(serializers.JSONField):
    """A JSON object."""

    default_error_messages = {"not_an_object": "Must be a JSON object."}

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        if not isinstance(value, dict):
            self.fail("not_an_object")
        return value


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "minItems": 1, "items": {"type": "object"}},
        ]
    }
)
class RunInputField(serializers.JSONField):
    """A string or a list of content blocks (checked by `services.start_run`)."""


# --------------------------------------------------------------------------- requests


class RunCreateSerializer(serializers.Serializer):
    agent = StorableCharField(max_length=200, help_text="The name of a registered agent.")
    input = RunInputField(help_text="A non-empty string or a list of content blocks.")
    metadata = ObjectField(required=False, help_text="A JSON object kept on the run.")
    correlation_id = StorableCharField(max_length=200, required=False, allow_blank=True)
    deadline = serializers.DateTimeField(required=False, help_text="ISO 8601, in the future.")
    idempotency_key = StorableCharField(
        max_length=200,
        required=False,
        help_text=f"Also accepted as the `{IDEMPOTENCY_HEADER}` header.",
    )

    def validate_agent(self, value: str) -> str:
        if value not in registered_agents():
            raise serializers.ValidationError(f"No agent named {value!r}.")
        return value

    def validate_deadline(self, value: Any) -> Any:
        if value <= timezone.now():
            raise serializers.ValidationError("The deadline must be in the future.")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        request = self.context.get("request")
        header = request.headers.get(IDEMPOTENCY_HEADER) if request is not None else None
        if header is not None:
            header = header.strip()
            if not header or len(header) > 200 or text_problem(header):
                message = f"The {IDEMPOTENCY_HEADER} header must be 1-200 characters (no NUL)."
                raise serializers.ValidationError({"idempotency_key": message})
            body = attrs.get("idempotency_key")
            if body is not None and body != header:
                raise serializers.ValidationError(
                    {"idempotency_key": f"The {IDEMPOTENCY_HEADER} header and the body differ."}
                )
            attrs["idempotency_key"] = header
        return attrs


class CancelSerializer(serializers.Serializer):
    reason = StorableCharField(required=False, allow_blank=True, default="")


TOKEN_HELP = (
    "The call's approval token (from the run's `pending_decisions` or `/tool-calls/pending/`): "
    "a decision on a call that changed since is refused (409 `invalid_token`)."
)


class ApproveSerializer(serializers.Serializer):
    token = StorableCharField(help_text=TOKEN_HELP)
    note = StorableCharField(required=False, allow_blank=True, default="")
    arguments = ObjectField(
        required=False, help_text="Edited arguments, re-validated against the tool's schema."
    )


class RejectSerializer(serializers.Serializer):
    token = StorableCharField(help_text=TOKEN_HELP)
    reason = StorableCharField(help_text="Told to the model as the tool's error result.")


class ResolveSerializer(serializers.Serializer):
    token = StorableCharField(help_text=TOKEN_HELP)
    action = serializers.ChoiceField(choices=["done", "retry", "fail"])
    result = serializers.JSONField(
        required=False, help_text="The tool's result; required with action `done`."
    )
    note = StorableCharField(required=False, allow_blank=True, default="")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["action"] == "done" and attrs.get("result") is None:
            raise serializers.ValidationError(
                {"result": "Marking a call done needs the tool's result."}
            )
        return attrs


# --------------------------------------------------------------------------- responses


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
        return (call.approval_payload or {}).get("description", "")

    @extend_schema_field({"type": "string", "nullable": True})
    def get_token(self, call: ToolCall) -> str | None:
        request = self.context.get("request")
        if request is None or not can_decide(request.user):
            return None
        return services.approval_token(call)


class TurnSerializer(serializers.ModelSerializer):
    state = StateField(TurnState)
    usage = UsageSerializer(source="*", read_only=True)
    tool_calls = ToolCallSerializer(many=True, read_only=True)

    class Meta:
        model = Turn
        fields = [
            "index",
            "state",
            "is_final",
            "model",
            "content",
            "stop_reason",
            "usage",
            "started_at",
            "finished_at",
            "tool_calls",
        ]
        read_only_fields = fields


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

    class Meta(RunSerializer.Meta):
        fields = [
            *RunSerializer.Meta.fields,
            "model",
            "idempotency_key",
            "input",
            "output",
            "error_message",
            "failure_phase",
            "last_checkpoint",
            "cancel",
            "last_seq",
            "turns",
            "pending_decisions",
        ]
        read_only_fields = fields

    @extend_schema_field(OpenApiTypes.STR)
    def get_model(self, run: Run) -> str:
        return (run.config or {}).get("model", "")

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
