"""Conversations: their requests (validated here, applied by `services`) and their
representations (a conversation with its status and its runs in order)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ...models import Conversation
from ...runconfig import RunConfig
from ...states import ConversationPolicy, ConversationStatus
from .fields import ObjectField, RunInputField, StateField, StorableCharField
from .requests import IDEMPOTENCY_HEADER, IdempotencyKeyMixin
from .responses import RunSerializer

POLICY_HELP = (
    "What becomes of a message sent while a run of the conversation is active: `reject` "
    "(409 `conversation_busy`), `enqueue` (it starts once the active runs have ended), "
    "`interrupt` (they are cancelled; closed tool calls keep their results) or `rollback` "
    "(as interrupt, and they are left out of the history)."
)


class ConversationCreateSerializer(serializers.Serializer):
    agent = StorableCharField(
        max_length=200,
        help_text="The name of an agent you may start (any other name, whether or not an "
        "agent has it, is the same 403).",
    )
    policy = serializers.ChoiceField(
        choices=ConversationPolicy.choices,
        default=ConversationPolicy.ENQUEUE,
        help_text=f"The default for its messages. {POLICY_HELP}",
    )
    metadata = ObjectField(required=False, help_text="A JSON object kept on the conversation.")


class MessageSerializer(IdempotencyKeyMixin, serializers.Serializer):
    input = RunInputField(help_text="A non-empty string or a list of content blocks.")
    context = StorableCharField(
        required=False,
        allow_blank=True,
        help_text="Context for this message only (the date, the user's mode): sent as a text "
        "block after the input, in the same user message, never in the system prompt; after "
        "the text of the agent's context hook, if any.",
    )
    policy = serializers.ChoiceField(
        choices=ConversationPolicy.choices,
        required=False,
        help_text=f"Default: the conversation's. {POLICY_HELP}",
    )
    metadata = ObjectField(required=False, help_text="A JSON object kept on the new run.")
    idempotency_key = StorableCharField(
        max_length=200,
        required=False,
        help_text=f"Also accepted as the `{IDEMPOTENCY_HEADER}` header: a repeated message "
        "returns the first run (200).",
    )

    def validate(self, attrs: dict) -> dict:
        # A conversation's options are those of its start: with thinking between_tools the
        # API refuses an effort that changes within a conversation (What's new in Claude
        # Sonnet 5.5), so a message never changes them (said, not silently dropped).
        if "options" in self.initial_data:
            raise serializers.ValidationError(
                {
                    "options": [
                        "A conversation keeps the options it started with (its model, "
                        "thinking and effort): a message cannot change them. Start a new "
                        "conversation for other options."
                    ]
                }
            )
        return super().validate(attrs)


class ConversationRunSerializer(RunSerializer):
    """A run of a conversation: the message (input and context) and the answer."""

    class Meta(RunSerializer.Meta):
        fields = [*RunSerializer.Meta.fields, "input", "context", "output", "error_message"]
        # (the run detail, /runs/{id}/, has its turns and tool calls)
        read_only_fields = fields


class ConversationSerializer(serializers.ModelSerializer):
    """A conversation in a listing."""

    status = StateField(
        ConversationStatus,
        help_text="From its runs: `idle`, `busy`, `waiting` (for a person), `interrupted` or "
        "`failed`.",
    )
    model = serializers.SerializerMethodField()

    class Meta:
        model = Conversation
        fields = ["id", "agent", "model", "owner", "policy", "status", "metadata"]
        fields += ["created_at", "updated_at"]
        read_only_fields = fields

    @extend_schema_field(OpenApiTypes.STR)
    def get_model(self, conversation: Conversation) -> str:
        return RunConfig.of(conversation.config).model


class ConversationDetailSerializer(ConversationSerializer):
    """A conversation with its runs, in order."""

    runs = serializers.SerializerMethodField()

    class Meta(ConversationSerializer.Meta):
        fields = [*ConversationSerializer.Meta.fields, "runs"]
        read_only_fields = fields

    @extend_schema_field(ConversationRunSerializer(many=True))
    def get_runs(self, conversation: Conversation) -> list[dict[str, Any]]:
        runs = conversation.runs.order_by("conversation_position")
        return ConversationRunSerializer(runs, many=True, context=self.context).data
