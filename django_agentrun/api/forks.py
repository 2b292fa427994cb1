"""`POST /runs/{id}/fork/`: start a new run from a turn of one the caller may see
(`services.fork_run`). The run's owner may fork it, as may a user with
`agentrun.cancel_run`: a fork re-runs a conversation from a point of its history, as a
resume re-runs it from its end, so it takes the permission that resumes runs. A fork begins
a run, so the agent's start rule applies to whoever asks (`services.check_begin`), and the
fork is theirs: it acts with their credentials, not the original owner's."""

from __future__ import annotations

from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from .. import services
from ..exceptions import InvalidInput, OptionRefused
from . import serializers as s
from .permissions import CanCancelRun
from .schema import operation


class ForkSerializer(serializers.Serializer):
    turn = serializers.IntegerField(
        min_value=0,
        help_text="The turn the new run asks the model again; the turns before it are copied "
        "with their tool calls' recorded results (nothing is re-executed).",
    )


class ForkActionMixin:
    """The `fork` action of RunViewSet (needs its `get_object` and `_detail`)."""

    @operation(
        summary="Fork a run from a turn",
        description=(
            "Creates a queued run with the run's agent, configuration snapshot, input and "
            "metadata, owned by the caller (it acts with their credentials; an agent with "
            "`run_as='owner'` keeps the original's owner), holding a copy of its turns before "
            "`turn`, and enqueues it; `forked_from` and `forked_at_turn` link it to the "
            "original. The run's owner, or a user with `agentrun.cancel_run`, if the agent's "
            "`api_start` rule lets them start it."
        ),
        request=ForkSerializer,
        responses={201: s.RunDetailSerializer},
        errors={
            400: "Field errors (`invalid`), a turn the run does not have, or an agent no "
            "longer defined (`unknown_agent`).",
            403: "Not the run's owner nor a user with `agentrun.cancel_run`, or the agent's "
            "`api_start` rule does not let you start it (`permission_denied`).",
            409: "A turn before `turn` has a tool call without a result, or the conversation "
            "ended before it (`invalid_transition`).",
        },
    )
    @action(detail=True, methods=["post"], permission_classes=[IsAuthenticated, CanCancelRun])
    def fork(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()  # type: ignore[attr-defined]
        body = ForkSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        services.check_begin(request.user, run, "fork")
        try:
            fork = services.fork_run(run, at_turn=body.validated_data["turn"], by=request.user)
        except OptionRefused:
            raise  # option_refused: a 400 naming the option, the value and the model
        except InvalidInput as exc:
            raise ValidationError({"turn": [str(exc)]}) from exc
        return self._detail(fork, status.HTTP_201_CREATED)  # type: ignore[attr-defined]
