"""DRF endpoints for runs and tool-call decisions: a few lines each around `services`.

Status codes: a run or call the user may not see is 404 (so is an id of the wrong
form); a missing permission on something they can see is 403; a bad body or query
parameter is 400; a refusal from the services is mapped by class (`ERROR_STATUS`).
Every error body is `{"code": ..., "detail": ...}` (`api.errors`). An approval token
that does not match the call (stale after an edit, or forged) is 409
`invalid_token`: reload the call and its fresh token, as for any other conflict
with the call's current state.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import Prefetch, QuerySet
from drf_spectacular.renderers import (
    OpenApiJsonRenderer,
    OpenApiJsonRenderer2,
    OpenApiYamlRenderer,
    OpenApiYamlRenderer2,
)
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from drf_spectacular.views import SpectacularAPIView
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings

from .. import services, telemetry
from ..models import Run, ToolCall, Turn
from ..states import RunState
from . import controls
from . import serializers as s
from .base import AgentRunAPIView, FormatNegotiation
from .errors import ERROR_STATUS, exception_handler, status_for
from .forks import ForkActionMixin
from .pagination import PendingPagination, RunPagination
from .params import int_param, text_param
from .permissions import CanCancelRun, CanDecideToolCalls, visible_runs, visible_tool_calls
from .schema import operation

__all__ = ["ERROR_STATUS", "RunViewSet", "SchemaView", "ToolCallViewSet", "status_for"]

EVENTS_PAGE_SIZE = 100
EVENTS_MAX_PAGE_SIZE = 500
# RunEvent.seq is a PositiveIntegerField: an `after` past this matches nothing anyway.
MAX_SEQ = 2**31 - 1
# A tool call id beyond a bigint cannot exist.
MAX_ID = 2**63 - 1
# Any single path segment reaches the view, which answers 404 for ids of the wrong
# form; a stricter regex would leave them to Django's HTML 404 page.
ANY_ID = "[^/]+"

RUN_CONFLICTS = "The run's state does not allow it (`invalid_transition`, `run_not_active`)."
DECISION_CONFLICTS = (
    "The call is no longer waiting for this decision (`approval_error`), or the token is "
    "stale or forged (`invalid_token`)."
)


def detail_queryset(qs: QuerySet[Run]) -> QuerySet[Run]:
    """Runs with what the run detail shows (turns and their calls, in order)."""
    calls = ToolCall.objects.order_by("position")
    turns = Turn.objects.order_by("index").prefetch_related(Prefetch("tool_calls", queryset=calls))
    return qs.prefetch_related(Prefetch("turns", queryset=turns))


class RunViewSet(
    AgentRunAPIView,
    ForkActionMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Start, list, inspect, cancel, resume and fork the runs the user may see."""

    permission_classes = [IsAuthenticated]
    pagination_class = RunPagination
    serializer_class = s.RunSerializer
    lookup_value_regex = ANY_ID
    id_type = OpenApiTypes.UUID

    def get_queryset(self) -> QuerySet[Run]:
        qs = visible_runs(self.request.user)
        if self.action == "list":
            return self._filtered(qs)
        if self.action == "retrieve":
            return detail_queryset(qs)
        return qs

    def get_object(self) -> Run:
        try:
            pk = uuid.UUID(self.kwargs["pk"])
        except ValueError:
            raise NotFound("No such run.") from None
        run = self.get_queryset().filter(pk=pk).first()
        if run is None:
            raise NotFound("No such run.")
        self.check_object_permissions(self.request, run)
        return run

    def get_serializer_class(self):
        if self.action == "list":
            return s.RunSerializer
        return s.RunDetailSerializer

    def _filtered(self, qs: QuerySet[Run]) -> QuerySet[Run]:
        state = text_param(self.request, "state")
        if state:
            states = [v for v in state.split(",") if v]
            unknown = sorted(set(states) - set(RunState.values))
            if unknown:
                choices = ", ".join(RunState.values)
                raise ValidationError(
                    {"state": [f"Unknown state {unknown[0]!r}; one of {choices}."]}
                )
            qs = qs.filter(state__in=states)
        agent = text_param(self.request, "agent")
        if agent:
            qs = qs.filter(agent=agent)
        return qs

    def _detail(self, run: Run, code: int = status.HTTP_200_OK) -> Response:
        fresh = detail_queryset(Run.objects.filter(pk=run.pk)).get()
        return Response(self.get_serializer(fresh).data, status=code)

    @operation(
        summary="List runs",
        parameters=(
            OpenApiParameter(
                "state", str, description="Comma-separated states, e.g. `failed,cancelled`."
            ),
            OpenApiParameter("agent", str, description="An agent name."),
        ),
        responses={200: s.RunSerializer(many=True)},
    )
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    @operation(
        summary="Start a run",
        description=(
            "Creates a queued run owned by the caller and enqueues it. With an idempotency key "
            "(body or `Idempotency-Key` header) a repeated request returns the first run (200); "
            "the same key with another body is a 422. The agent decides who may start it "
            "(`api_start`) and which `options` a client may set (`client_options`); a "
            "`deadline` past the agent's own time limit is brought back to it."
        ),
        request=s.RunCreateSerializer,
        parameters=(
            OpenApiParameter(s.IDEMPOTENCY_HEADER, str, OpenApiParameter.HEADER, required=False),
        ),
        responses={
            201: s.RunDetailSerializer,
            200: OpenApiResponse(s.RunDetailSerializer, description="Same idempotency key."),
        },
        errors=controls.START_ERRORS,
    )
    def create(self, request: Request) -> Response:
        body = s.RunCreateSerializer(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        # The run joins the trace of the client's `traceparent` (telemetry.py).
        with telemetry.continued(request.headers):
            run, existed = controls.start(request.user, body.validated_data)
        return self._detail(run, status.HTTP_200_OK if existed else status.HTTP_201_CREATED)

    @operation(
        summary="A run with its turns and tool calls",
        responses={200: s.RunDetailSerializer},
    )
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().retrieve(request, *args, **kwargs)

    @operation(
        summary="A run's events, oldest first",
        description=(
            "Each event's payload holds only the keys of its type that the run detail shows "
            "too (no configuration snapshot, worker identities, lease epochs or tokens)."
        ),
        parameters=(
            OpenApiParameter(
                "after",
                {"type": "integer", "minimum": 0, "maximum": MAX_SEQ},
                description="Only events with a greater seq.",
            ),
            OpenApiParameter(
                "limit",
                {"type": "integer", "minimum": 1},
                description=f"Page size (default {EVENTS_PAGE_SIZE}, "
                f"at most {EVENTS_MAX_PAGE_SIZE}).",
            ),
        ),
        responses={200: s.RunEventPageSerializer},
    )
    @action(detail=True, methods=["get"])
    def events(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        after = int_param(request, "after", 0, minimum=0, maximum=MAX_SEQ)
        limit = int_param(request, "limit", EVENTS_PAGE_SIZE, minimum=1)
        limit = min(limit, EVENTS_MAX_PAGE_SIZE)
        rows = list(run.events.filter(seq__gt=after).order_by("seq")[: limit + 1])
        more, rows = len(rows) > limit, rows[:limit]
        last_seq = rows[-1].seq if rows else after
        next_url = None
        if more:
            next_url = request.build_absolute_uri(f"{request.path}?after={last_seq}&limit={limit}")
        page = {
            "run_state": run.state,
            "last_seq": last_seq,
            "next": next_url,
            "results": s.RunEventSerializer(rows, many=True).data,
        }
        return Response(page)

    @operation(
        summary="Cancel a run",
        description=(
            "Applied at once when no worker holds the run; otherwise `cancel.requested_at` is "
            "set and the worker stops within about a second. Cancelling twice is a no-op. "
            "The run's owner, or a user with `agentrun.cancel_run`."
        ),
        request=s.CancelSerializer,
        responses={200: s.RunDetailSerializer},
        errors={409: RUN_CONFLICTS},
    )
    @action(detail=True, methods=["post"], permission_classes=[IsAuthenticated, CanCancelRun])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        body = s.CancelSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        run = services.cancel_run(run, by=request.user, reason=body.validated_data["reason"])
        return self._detail(run)

    @operation(
        summary="Resume a failed, cancelled or timed-out run",
        description=(
            "The run's owner, if the agent's `api_start` rule still lets them start it. "
            "A user with `agentrun.cancel_run` resumes another user's run only when the "
            "agent's runs act for their owner (`run_as='owner'`); otherwise they fork it. "
            "Takes no body."
        ),
        responses={200: s.RunDetailSerializer},
        errors={
            400: "The run's agent is no longer defined (`unknown_agent`).",
            403: "Not the run's owner nor a user with `agentrun.cancel_run`; the agent's "
            "`api_start` rule; or another user's run (`permission_denied`).",
            409: RUN_CONFLICTS,
        },
    )
    @action(detail=True, methods=["post"], permission_classes=[IsAuthenticated, CanCancelRun])
    def resume(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        _ = request.data  # parsed though unused: a malformed body is a 400, as on every POST
        services.check_begin(request.user, run, "resume")
        return self._detail(services.resume_run(run, by=request.user))


class ToolCallViewSet(AgentRunAPIView, viewsets.GenericViewSet):
    """Decisions on tool calls waiting for a person (needs `agentrun.approve_toolcall`)."""

    permission_classes = [IsAuthenticated, CanDecideToolCalls]
    serializer_class = s.PendingDecisionSerializer
    pagination_class = PendingPagination
    lookup_value_regex = ANY_ID
    id_type = {"type": "integer", "minimum": 1, "maximum": MAX_ID}

    def get_queryset(self) -> QuerySet[ToolCall]:
        return visible_tool_calls(self.request.user).select_related("run")

    def get_object(self) -> ToolCall:
        raw = self.kwargs["pk"]
        pk = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 19 else 0
        call = self.get_queryset().filter(pk=pk).first() if 0 < pk <= MAX_ID else None
        if call is None:
            raise NotFound("No such tool call.")
        self.check_object_permissions(self.request, call)
        return call

    def _decided(self, call: ToolCall) -> Response:
        fresh = ToolCall.objects.select_related("run").get(pk=call.pk)
        return Response(s.DecisionResultSerializer(fresh).data)

    @operation(
        summary="Tool calls waiting for a decision",
        description="Approvals and unknown outcomes in the runs the user can see, oldest first.",
        responses={200: s.PendingDecisionSerializer(many=True)},
    )
    @action(detail=False, methods=["get"])
    def pending(self, request: Request) -> Response:
        qs = self.get_queryset().pending_decision()
        page = self.paginate_queryset(qs)
        return self.get_paginated_response(self.get_serializer(page, many=True).data)

    @operation(
        summary="Approve a call (optionally with edited arguments)",
        request=s.ApproveSerializer,
        responses={200: s.DecisionResultSerializer},
        errors={
            400: "Malformed JSON (`parse_error`), field errors (`invalid`), or edited "
            "arguments that fail the tool's schema (`invalid_arguments`).",
            409: DECISION_CONFLICTS,
        },
    )
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str | None = None) -> Response:
        call = self.get_object()
        body = s.ApproveSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        arguments = data.get("arguments")
        services.approve_tool_call(
            call,
            by=request.user,
            note=data["note"],
            # Unchanged arguments are no edit: only a real edit is re-validated and recorded.
            arguments=arguments if arguments is not None and arguments != call.arguments else None,
            token=data["token"],
        )
        return self._decided(call)

    @operation(
        summary="Reject a call; the model is told why",
        request=s.RejectSerializer,
        responses={200: s.DecisionResultSerializer},
        errors={409: DECISION_CONFLICTS},
    )
    @action(detail=True, methods=["post"])
    def reject(self, request: Request, pk: str | None = None) -> Response:
        call = self.get_object()
        body = s.RejectSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        services.reject_tool_call(call, by=request.user, reason=data["reason"], token=data["token"])
        return self._decided(call)

    @operation(
        summary="Settle a call whose outcome is unknown",
        request=s.ResolveSerializer,
        responses={200: s.DecisionResultSerializer},
        errors={409: DECISION_CONFLICTS},
    )
    @action(detail=True, methods=["post"])
    def resolve(self, request: Request, pk: str | None = None) -> Response:
        call = self.get_object()
        body = s.ResolveSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        services.resolve_tool_call(
            call,
            by=request.user,
            action=data["action"],
            result=data.get("result"),
            note=data["note"],
            token=data["token"],
        )
        return self._decided(call)


class SchemaView(SpectacularAPIView):
    """The OpenAPI document of this API alone (JSON; YAML with `?format=yaml`), for the
    same users as the API itself. Needs no REST_FRAMEWORK or SPECTACULAR_SETTINGS and
    no `drf_spectacular` in INSTALLED_APPS."""

    schema = None  # not an operation of the document it serves
    content_negotiation_class = FormatNegotiation
    # JSON first (application/json), then the OpenAPI media types and YAML.
    renderer_classes = [
        OpenApiJsonRenderer2,
        OpenApiJsonRenderer,
        OpenApiYamlRenderer,
        OpenApiYamlRenderer2,
    ]
    authentication_classes = api_settings.DEFAULT_AUTHENTICATION_CLASSES
    permission_classes = [IsAuthenticated]
    custom_settings = {
        "TITLE": "django-agentrun",
        "DESCRIPTION": "Runs, their events, and decisions on tool calls.",
        "VERSION": "1",
        "PREPROCESSING_HOOKS": ["django_agentrun.api.base.this_api_only"],
        "POSTPROCESSING_HOOKS": [
            "drf_spectacular.hooks.postprocess_schema_enums",
            "django_agentrun.api.stream_schema.document_streams",
        ],
    }

    def get_exception_handler(self) -> Any:
        return exception_handler

    def handle_exception(self, exc: Exception) -> Response:
        response = super().handle_exception(exc)
        # An error is JSON like every other error of the API, not an OpenAPI document.
        self.request.accepted_renderer = JSONRenderer()
        self.request.accepted_media_type = JSONRenderer.media_type
        return response
