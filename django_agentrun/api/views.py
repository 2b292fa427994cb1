"""DRF endpoints for runs and tool-call decisions: a few lines each around `services`.

Status codes: a run or call the user may not see is 404; a missing permission on
something they can see is 403; a bad body is 400 with field errors; a refusal
from the services is mapped by class (`ERROR_STATUS`) to a body
`{"code": ..., "detail": ...}`. An approval token that does not match the call
(stale after an edit, or forged) is 409 `invalid_token`: reload the call and its
fresh token, as for any other conflict with the call's current state.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Prefetch, QuerySet
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.parsers import JSONParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

from .. import services
from ..exceptions import (
    AgentRunError,
    ApprovalError,
    ConcurrentUpdate,
    IdempotencyConflict,
    InvalidArguments,
    InvalidInput,
    InvalidToken,
    InvalidTransition,
    UnknownAgent,
)
from ..models import Run, ToolCall, Turn
from ..states import RunState
from . import serializers as s
from .permissions import CanCancelRun, CanDecideToolCalls, visible_runs, visible_tool_calls

# Looked up along the exception's MRO, so a subclass inherits its parent's status.
# Errors not listed (LeaseLost, ConfigurationError...) are server faults: a logged 500.
ERROR_STATUS: dict[type[AgentRunError], int] = {
    InvalidInput: status.HTTP_400_BAD_REQUEST,
    UnknownAgent: status.HTTP_400_BAD_REQUEST,
    InvalidArguments: status.HTTP_400_BAD_REQUEST,
    InvalidToken: status.HTTP_409_CONFLICT,
    ApprovalError: status.HTTP_409_CONFLICT,
    InvalidTransition: status.HTTP_409_CONFLICT,
    ConcurrentUpdate: status.HTTP_409_CONFLICT,
    IdempotencyConflict: status.HTTP_409_CONFLICT,
}

EVENTS_PAGE_SIZE = 100
EVENTS_MAX_PAGE_SIZE = 500


def status_for(exc: AgentRunError) -> int | None:
    for cls in type(exc).__mro__:
        if cls in ERROR_STATUS:
            return ERROR_STATUS[cls]
    return None


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Map AgentRunError subclasses to statuses; everything else goes to the project's handler."""
    if isinstance(exc, AgentRunError):
        code = status_for(exc)
        if code is not None:
            set_rollback()
            return Response({"code": exc.code, "detail": str(exc)}, status=code)
    fallback = api_settings.EXCEPTION_HANDLER
    if fallback is exception_handler:  # the project installed this one globally
        fallback = drf_exception_handler
    return fallback(exc, context)


def _errors(*codes: int) -> dict[int, OpenApiResponse]:
    return {code: OpenApiResponse(s.ErrorSerializer) for code in codes}


class _AgentRunAPI:
    """Shared settings: JSON bodies, authenticated users, the error mapping."""

    parser_classes = [JSONParser]

    def get_exception_handler(self):
        return exception_handler


class RunPagination(CursorPagination):
    """Newest first; a cursor stays stable while new runs are created."""

    page_size = 50
    max_page_size = 200
    page_size_query_param = "page_size"
    ordering = "-created_at"


class PendingPagination(CursorPagination):
    """Oldest first: the queue of decisions."""

    page_size = 50
    max_page_size = 200
    page_size_query_param = "page_size"
    ordering = "created_at"


def _detail_queryset(qs: QuerySet[Run]) -> QuerySet[Run]:
    calls = ToolCall.objects.order_by("position")
    turns = Turn.objects.order_by("index").prefetch_related(Prefetch("tool_calls", queryset=calls))
    return qs.prefetch_related(Prefetch("turns", queryset=turns))


class RunViewSet(
    _AgentRunAPI,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Start, list, inspect, cancel and resume the runs the user may see."""

    permission_classes = [IsAuthenticated]
    pagination_class = RunPagination
    serializer_class = s.RunSerializer
    lookup_value_regex = "[0-9a-fA-F-]{32,36}"

    def get_queryset(self) -> QuerySet[Run]:
        qs = visible_runs(self.request.user)
        if self.action == "list":
            return self._filtered(qs)
        if self.action == "retrieve":
            return _detail_queryset(qs)
        return qs

    def get_serializer_class(self):
        if self.action == "list":
            return s.RunSerializer
        return s.RunDetailSerializer

    def _filtered(self, qs: QuerySet[Run]) -> QuerySet[Run]:
        params = self.request.query_params
        if params.get("state"):
            states = [v for v in params["state"].split(",") if v]
            unknown = sorted(set(states) - set(RunState.values))
            if unknown:
                choices = ", ".join(RunState.values)
                raise ValidationError(
                    {"state": [f"Unknown state {unknown[0]!r}; one of {choices}."]}
                )
            qs = qs.filter(state__in=states)
        if params.get("agent"):
            qs = qs.filter(agent=params["agent"])
        return qs

    def _detail(self, run: Run, code: int = status.HTTP_200_OK) -> Response:
        fresh = _detail_queryset(Run.objects.filter(pk=run.pk)).get()
        return Response(self.get_serializer(fresh).data, status=code)

    @extend_schema(
        summary="List runs",
        parameters=[
            OpenApiParameter(
                "state", str, description="Comma-separated states, e.g. `failed,cancelled`."
            ),
            OpenApiParameter("agent", str, description="An agent name."),
        ],
        responses={200: s.RunSerializer(many=True), 400: OpenApiResponse(description="Bad filter")},
    )
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    @extend_schema(
        summary="Start a run",
        description=(
            "Creates a queued run owned by the caller and enqueues it. With an idempotency key "
            "(body or `Idempotency-Key` header) a repeated request returns the first run (200)."
        ),
        request=s.RunCreateSerializer,
        parameters=[
            OpenApiParameter(s.IDEMPOTENCY_HEADER, str, OpenApiParameter.HEADER, required=False)
        ],
        responses={
            201: s.RunDetailSerializer,
            200: OpenApiResponse(s.RunDetailSerializer, description="Same idempotency key."),
            400: OpenApiResponse(description="Field errors"),
            **_errors(409),
        },
    )
    def create(self, request: Request) -> Response:
        body = s.RunCreateSerializer(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        data = body.validated_data
        key = data.get("idempotency_key")
        # Decides 200 vs 201 only; two racing first requests may both get 201 (same run).
        existed = (
            key is not None and Run.objects.filter(owner=request.user, idempotency_key=key).exists()
        )
        try:
            run = services.start_run(
                data["agent"],
                data["input"],
                owner=request.user,
                idempotency_key=key,
                metadata=data.get("metadata"),
                correlation_id=data.get("correlation_id") or None,
                deadline=data.get("deadline"),
            )
        except UnknownAgent as exc:
            raise ValidationError({"agent": [str(exc)]}) from exc
        except InvalidInput as exc:
            raise ValidationError({"input": [str(exc)]}) from exc
        return self._detail(run, status.HTTP_200_OK if existed else status.HTTP_201_CREATED)

    @extend_schema(summary="A run with its turns and tool calls", responses=s.RunDetailSerializer)
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().retrieve(request, *args, **kwargs)

    @extend_schema(
        summary="A run's events, oldest first",
        parameters=[
            OpenApiParameter("after", int, description="Only events with a greater seq."),
            OpenApiParameter(
                "limit",
                int,
                description=f"Page size (default {EVENTS_PAGE_SIZE}, "
                f"at most {EVENTS_MAX_PAGE_SIZE}).",
            ),
        ],
        responses={200: s.RunEventPageSerializer, 400: OpenApiResponse(description="Bad cursor")},
    )
    @action(detail=True, methods=["get"])
    def events(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        after = _int_param(request, "after", 0, minimum=0)
        limit = _int_param(request, "limit", EVENTS_PAGE_SIZE, minimum=1)
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

    @extend_schema(
        summary="Cancel a run",
        description=(
            "Applied at once when no worker holds the run; otherwise `cancel.requested_at` is "
            "set and the worker stops within about a second. Cancelling twice is a no-op."
        ),
        request=s.CancelSerializer,
        responses={200: s.RunDetailSerializer, **_errors(403, 409)},
    )
    @action(detail=True, methods=["post"], permission_classes=[IsAuthenticated, CanCancelRun])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        body = s.CancelSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        run = services.cancel_run(run, by=request.user, reason=body.validated_data["reason"])
        return self._detail(run)

    @extend_schema(
        summary="Resume a failed, cancelled or timed-out run",
        request=None,
        responses={200: s.RunDetailSerializer, **_errors(403, 409)},
    )
    @action(detail=True, methods=["post"], permission_classes=[IsAuthenticated, CanCancelRun])
    def resume(self, request: Request, pk: str | None = None) -> Response:
        run = services.resume_run(self.get_object(), by=request.user)
        return self._detail(run)


def _int_param(request: Request, name: str, default: int, *, minimum: int) -> int:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise ValidationError({name: [f"Must be an integer >= {minimum}."]})
    return value


class ToolCallViewSet(_AgentRunAPI, viewsets.GenericViewSet):
    """Decisions on tool calls waiting for a person (needs `agentrun.approve_toolcall`)."""

    permission_classes = [IsAuthenticated, CanDecideToolCalls]
    serializer_class = s.PendingDecisionSerializer
    pagination_class = PendingPagination
    lookup_value_regex = r"\d+"

    def get_queryset(self) -> QuerySet[ToolCall]:
        return visible_tool_calls(self.request.user).select_related("run")

    def _decided(self, call: ToolCall) -> Response:
        fresh = ToolCall.objects.select_related("run").get(pk=call.pk)
        return Response(s.DecisionResultSerializer(fresh).data)

    @extend_schema(
        summary="Tool calls waiting for a decision",
        description="Approvals and unknown outcomes in the runs the user can see, oldest first.",
        responses={200: s.PendingDecisionSerializer(many=True), **_errors(403)},
    )
    @action(detail=False, methods=["get"])
    def pending(self, request: Request) -> Response:
        qs = self.get_queryset().pending_decision()
        page = self.paginate_queryset(qs)
        return self.get_paginated_response(self.get_serializer(page, many=True).data)

    @extend_schema(
        summary="Approve a call (optionally with edited arguments)",
        request=s.ApproveSerializer,
        responses={
            200: s.DecisionResultSerializer,
            400: OpenApiResponse(description="Field errors, or `invalid_arguments`"),
            **_errors(403, 409),
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

    @extend_schema(
        summary="Reject a call; the model is told why",
        request=s.RejectSerializer,
        responses={200: s.DecisionResultSerializer, **_errors(403, 409)},
    )
    @action(detail=True, methods=["post"])
    def reject(self, request: Request, pk: str | None = None) -> Response:
        call = self.get_object()
        body = s.RejectSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        services.reject_tool_call(
            call, by=request.user, reason=data["reason"], token=data.get("token")
        )
        return self._decided(call)

    @extend_schema(
        summary="Settle a call whose outcome is unknown",
        request=s.ResolveSerializer,
        responses={200: s.DecisionResultSerializer, **_errors(403, 409)},
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
            token=data.get("token"),
        )
        return self._decided(call)
