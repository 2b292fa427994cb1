"""The agent author's controls (`django_agentrun.access`) as the API applies them: who may
start an agent (403 `permission_denied`, asked of `services.authority`, the one rule for
every way a run begins), which run options a request may set (400 naming
them), a deadline no later than the agent's limit, and the request digest an idempotency
key is checked against."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ValidationError

from .. import services
from ..access import capped_deadline, refused_options
from ..agent_options import RUN_OPTIONS
from ..agents import Agent
from ..exceptions import InvalidInput, InvalidOption, OptionRefused, UnknownAgent
from ..models import Run
from ..services.runs import request_digest
from .schema import BODY_ERRORS, REUSED_KEY

MCP_UNAVAILABLE = (
    "An MCP server the agent takes tools from could not be reached to list them "
    "(`mcp_unavailable`): nothing was started; try again later."
)
START_ERRORS = {
    400: f"{BODY_ERRORS} An option the agent does not let clients set (`invalid`, "
    "`errors.options`).",
    403: "No agent of that name that you may start: the agent's `api_start` rule does not "
    "let you start it, or there is none (`permission_denied`, the same for both).",
    422: REUSED_KEY,
    503: MCP_UNAVAILABLE,
}
# The request fields a replay of an idempotency key must repeat (the deadline as sent).
START_FIELDS = ("agent", "input", "metadata", "correlation_id", "deadline", "options", "context")


def start(user: Any, data: dict[str, Any]) -> tuple[Run, bool]:
    """`POST /runs/`: the run started for a validated body, and whether it existed already
    (the same idempotency key and body: 200 rather than 201)."""
    agent = services.startable(user, data["agent"])
    check_options(agent, data.get("options"))
    key = data.get("idempotency_key")
    # Decides 200 vs 201 only; two racing first requests may both get 201 (same run).
    existed = key is not None and Run.objects.filter(owner=user, idempotency_key=key).exists()
    try:
        run = services.start_run(
            agent.name,
            data["input"],
            owner=user,
            idempotency_key=key,
            metadata=data.get("metadata"),
            correlation_id=data.get("correlation_id") or None,
            # Never past the agent's own time limit (the run shows the deadline it got).
            deadline=capped_deadline(agent, data.get("deadline")),
            options=data.get("options"),
            context=data.get("context"),
            request_hash=digest(data, *START_FIELDS),
        )
    except UnknownAgent as exc:
        raise ValidationError({"agent": [str(exc)]}) from exc
    except OptionRefused:
        raise  # option_refused: a 400 naming the option and the model
    except InvalidInput as exc:
        field = "options" if isinstance(exc, InvalidOption) else "input"
        raise ValidationError({field: [str(exc)]}) from exc
    return run, existed


def check_options(agent: Agent, options: dict[str, Any] | None) -> None:
    """A 400 naming each option the agent does not let clients set."""
    refused = refused_options(agent, options, RUN_OPTIONS)
    if refused:
        allowed = ", ".join(sorted(agent.client_options)) or "none"
        raise ValidationError(
            {
                "options": [
                    f"Agent {agent.name!r} does not let clients set {', '.join(refused)} "
                    f"(its client_options: {allowed})."
                ]
            }
        )


def digest(data: dict[str, Any], *fields: str, **more: Any) -> str:
    """The digest of a request's `fields` as the client sent them (a deadline before it is
    capped): what a replay of its idempotency key must ask for again."""
    return request_digest(**{name: data.get(name) for name in fields}, **more)
