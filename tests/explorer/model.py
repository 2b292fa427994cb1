"""The explorer's model: answers from the scenario's script, after a scheduling point (a
request sent is a point where another actor may move), and checks every request it is
sent against the Messages API's rules (the stand-in's validation, without its server)."""

from __future__ import annotations

from typing import Any

from django.db.models import Q

from django_agentrun.abort import AbortSignal
from django_agentrun.clients.anthropic import AnthropicModelClient
from django_agentrun.clients.base import ModelRequest, ModelResponse, StreamAborted, Usage
from django_agentrun.models import Turn
from django_agentrun.testing.messages_api.validation import validate_request

from .world import CURRENT


class ExplorerClient:
    def __init__(self, world: Any) -> None:
        self.world = world

    def create(self, request: ModelRequest, *, abort: AbortSignal) -> ModelResponse:
        self.world.controller.point("model.request")
        if abort.aborted:
            raise StreamAborted(abort.reason)
        self._sent()
        body = AnthropicModelClient.build_params(request)
        body.pop("betas", None)
        try:
            validate_request(body)
        except Exception as exc:  # noqa: BLE001 - the API would refuse it: a violation
            self.world.truth.violated(f"a request the Messages API refuses: {exc}")
        content = self.world.answer(request.messages)
        uses = any(b["type"] == "tool_use" for b in content)
        return ModelResponse(
            message_id=f"msg_x{id(content):x}",
            content=content,
            stop_reason="tool_use" if uses else "end_turn",
            usage=Usage(input_tokens=10, output_tokens=5),
            model=request.model,
        )

    def _sent(self) -> None:
        """The model is never asked twice for a recorded turn (the request goes out now)."""
        actor = CURRENT.get()
        run_id, index = getattr(actor, "asking", None) or (None, None)
        if run_id is None:
            return
        # Recorded: its content inline (rows before migration 0020) or named by its event.
        recorded = Q(content__isnull=False) | Q(content_seq__isnull=False)
        if Turn.objects.filter(recorded, run_id=run_id, index=index).exists():
            self.world.truth.violated(f"the model was asked again for recorded turn {index}")
