"""Request bodies: validated here, applied by `services` (nothing here saves a model)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from rest_framework import serializers

from ...agent_options import RUN_OPTIONS
from ..parsers import text_problem
from .fields import ObjectField, RunInputField, StorableCharField, StorableJSONField

IDEMPOTENCY_HEADER = "Idempotency-Key"


class IdempotencyKeyMixin:
    """An `idempotency_key` field that the `Idempotency-Key` header may give instead."""

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        request = self.context.get("request")  # type: ignore[attr-defined]
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


class RunCreateSerializer(IdempotencyKeyMixin, serializers.Serializer):
    agent = StorableCharField(
        max_length=200,
        help_text="The name of an agent you may start (any other name, whether or not an "
        "agent has it, is the same 403).",
    )
    input = RunInputField(help_text="A non-empty string or a list of content blocks.")
    metadata = ObjectField(required=False, help_text="A JSON object kept on the run.")
    correlation_id = StorableCharField(max_length=200, required=False, allow_blank=True)
    deadline = serializers.DateTimeField(
        required=False,
        help_text="ISO 8601, in the future; no later than the agent's own time limit "
        "(a later one is brought back to it).",
    )
    idempotency_key = StorableCharField(
        max_length=200,
        required=False,
        help_text=f"Also accepted as the `{IDEMPOTENCY_HEADER}` header.",
    )
    options = ObjectField(
        required=False,
        help_text="The run's own request options over the agent's, among "
        + ", ".join(f"`{name}`" for name in RUN_OPTIONS)
        + ": only those the agent lets clients set (`Agent(client_options=...)`). One it "
        "does not, a bad value, or one the agent's model refuses, is a 400 naming it.",
    )
    context = StorableCharField(
        required=False,
        allow_blank=True,
        help_text="Text sent after the input in the same user message (a date, a mode), "
        "never in the system prompt; after the text of the agent's context hook, if any.",
    )

    def validate_deadline(self, value: Any) -> Any:
        if value <= timezone.now():
            raise serializers.ValidationError("The deadline must be in the future.")
        return value


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
    result = StorableJSONField(
        required=False, help_text="The tool's result; required with action `done`."
    )
    note = StorableCharField(required=False, allow_blank=True, default="")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["action"] == "done" and attrs.get("result") is None:
            raise serializers.ValidationError(
                {"result": "Marking a call done needs the tool's result."}
            )
        return attrs
