"""Conversations over the API: start one, list and inspect them (each with its status and
its runs in order), send a message (a new run whose history is the earlier runs'), stop.
A few lines each around `services`; visibility as for runs (a conversation the user may
not see is a 404), messages from the owner only, stopping by the owner or a user with
`agentrun.cancel_run`."""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from .. import services, telemetry
from ..exceptions import InvalidInput, OptionRefused
from ..models import Conversation, Run
from . import controls
from . import serializers as s
from .base import AgentRunAPIView
from .pagination import ConversationPagination
from .params import text_param
from .permissions import CanSendMessage, CanStopConversation, visible_conversations
from .schema import REUSED_KEY, operation
from .views import ANY_ID, detail_queryset

MESSAGE_CONFLICTS = (
    "A run of the conversation is active and the message's policy is `reject` "
    "(`conversation_busy`)."
)
NOT_STARTABLE = "The agent's `api_start` rule does not let you start it (`permission_denied`)."


class ConversationViewSet(
    AgentRunAPIView,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Start, list, inspect, message and stop the conversations the user may see."""

    permission_classes = [IsAuthenticated]
    pagination_class = ConversationPagination
    serializer_class = s.ConversationSerializer
    lookup_value_regex = ANY_ID
    id_type = OpenApiTypes.UUID

    def get_queryset(self) -> QuerySet[Conversation]:
        qs = visible_conversations(self.request.user).with_status()
        if self.action == "list":
            agent = text_param(self.request, "agent")
            if agent:
                qs = qs.filter(agent=agent)
        return qs

    def get_object(self) -> Conversation:
        try:
            pk = uuid.UUID(self.kwargs["pk"])
        except ValueError:
            raise NotFound("No such conversation.") from None
        conversation = self.get_queryset().filter(pk=pk).first()
        if conversation is None:
            raise NotFound("No such conversation.")
        self.check_object_permissions(self.request, conversation)
        return conversation

    def get_serializer_class(self):
        if self.action == "list":
            return s.ConversationSerializer
        return s.ConversationDetailSerializer

    def _detail(self, conversation: Conversation, code: int = status.HTTP_200_OK) -> Response:
        fresh = Conversation.objects.with_status().get(pk=conversation.pk)
        return Response(s.ConversationDetailSerializer(fresh).data, status=code)

    @operation(
        summary="List conversations",
        parameters=(OpenApiParameter("agent", str, description="An agent name."),),
        responses={200: s.ConversationSerializer(many=True)},
    )
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    @operation(
        summary="Start a conversation",
        description=(
            "Creates a conversation owned by the caller with a snapshot of the agent's "
            "configuration: its system prompt and tools stay as they are now for the life of "
            "the conversation. Send it messages with `POST /conversations/{id}/messages/`."
        ),
        request=s.ConversationCreateSerializer,
        responses={201: s.ConversationDetailSerializer},
        errors={403: NOT_STARTABLE, 503: controls.MCP_UNAVAILABLE},
    )
    def create(self, request: Request) -> Response:
        body = s.ConversationCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        services.startable(request.user, data["agent"])
        conversation = services.start_conversation(
            data["agent"], owner=request.user, policy=data["policy"], metadata=data.get("metadata")
        )
        return self._detail(conversation, status.HTTP_201_CREATED)

    @operation(
        summary="A conversation with its runs, in order",
        responses={200: s.ConversationDetailSerializer},
    )
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().retrieve(request, *args, **kwargs)

    @operation(
        summary="Send a message",
        description=(
            "Starts the conversation's next run: its history is the earlier runs' transcripts "
            "(rolled-back ones left out), then `input` and `context`. While a run is active, "
            "`policy` decides (default: the conversation's). With an idempotency key (body or "
            f"`{s.IDEMPOTENCY_HEADER}` header) a repeated message returns the first run (200); "
            "two concurrent requests with one key create one run. The conversation's owner only."
        ),
        request=s.MessageSerializer,
        parameters=(
            OpenApiParameter(s.IDEMPOTENCY_HEADER, str, OpenApiParameter.HEADER, required=False),
        ),
        responses={
            201: s.RunDetailSerializer,
            200: OpenApiResponse(s.RunDetailSerializer, description="Same idempotency key."),
        },
        errors={
            403: f"Not the conversation's owner, or {NOT_STARTABLE[0].lower()}{NOT_STARTABLE[1:]}",
            409: MESSAGE_CONFLICTS,
            422: REUSED_KEY,
        },
    )
    @action(detail=True, methods=["post"], permission_classes=[IsAuthenticated, CanSendMessage])
    def messages(self, request: Request, pk: str | None = None) -> Response:
        conversation = self.get_object()
        body = s.MessageSerializer(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        data = body.validated_data
        services.check_begin(request.user, conversation, "send a message to")
        key = data.get("idempotency_key")
        # Decides 200 vs 201 only (the service returns the first run either way).
        existed = key is not None and Run.objects.filter(owner=request.user, idempotency_key=key)
        existed = bool(existed and existed.exists())
        try:
            with telemetry.continued(request.headers):  # the client's traceparent, if any
                run = services.send_message(
                    conversation,
                    data["input"],
                    policy=data.get("policy"),
                    context=data.get("context"),
                    idempotency_key=key,
                    metadata=data.get("metadata"),
                    by=request.user,
                    request_hash=controls.digest(
                        data,
                        "input",
                        "context",
                        "metadata",
                        "policy",
                        conversation=str(conversation.pk),
                    ),
                )
        except OptionRefused:
            raise  # option_refused: a 400 naming the option, the value and the model
        except InvalidInput as exc:
            raise ValidationError({"input": [str(exc)]}) from exc
        fresh = detail_queryset(Run.objects.filter(pk=run.pk)).get()
        code = status.HTTP_200_OK if existed else status.HTTP_201_CREATED
        return Response(
            s.RunDetailSerializer(fresh, context={"request": request}).data, status=code
        )

    @operation(
        summary="Stop a conversation",
        description=(
            "Cancels every active run of it, the running one and those waiting behind it (a "
            "worker holding one stops it within about a second). Stopping a conversation "
            "with no active run changes nothing. The owner, or a user with "
            "`agentrun.cancel_run`."
        ),
        request=s.CancelSerializer,
        responses={200: s.ConversationDetailSerializer},
    )
    @action(
        detail=True, methods=["post"], permission_classes=[IsAuthenticated, CanStopConversation]
    )
    def stop(self, request: Request, pk: str | None = None) -> Response:
        conversation = self.get_object()
        body = s.CancelSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        services.stop_conversation(
            conversation, by=request.user, reason=body.validated_data["reason"]
        )
        return self._detail(conversation)
