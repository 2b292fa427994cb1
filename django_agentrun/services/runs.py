"""Starting, cancelling and resuming runs: the public commands, a few lines each around
the transitions (transitions.py), each in one unit of work."""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from .. import catalog, store, telemetry, transitions, wakeups
from ..agents import Agent, get_agent, owner_user_id
from ..content import BLOCK_TYPES, has_cache_control, validate_blocks
from ..exceptions import (
    IdempotencyConflict,
    InvalidInput,
    InvalidOption,
    InvalidTransition,
    OptionRefused,
    RunNotActive,
    UnknownAgent,
)
from ..fields import StorableJSONEncoder, check_json, check_text, unsendable
from ..models import Run
from ..runconfig import RunConfig
from ..states import RunState
from ..store import database_now
from .retrying import retry_lost_race

logger = logging.getLogger(__name__)

# Input blocks that may set cache_control: the API allows 4 breakpoints a request, and
# the engine places 2 (tools and system).
INPUT_BREAKPOINTS = 2


def validate_input(value: Any) -> Any:
    """A run's input as it is stored: a non-empty string, or content blocks the Messages
    API accepts in a user message, that can be sent as UTF-8 (InvalidInput naming the
    block otherwise)."""
    where = unsendable(value, "input")
    if where is not None:
        raise InvalidInput(
            f"{where} holds an unpaired surrogate character (\\ud800-\\udfff), which cannot "
            "be sent to the model: give text as valid Unicode."
        )
    if isinstance(value, str):
        if not value.strip():
            raise InvalidInput("The input must not be empty.")
        return value
    if isinstance(value, list) and value:
        for i, block in enumerate(value):
            if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                raise InvalidInput(f"input[{i}] must be a content block with a 'type'.")
            if block["type"] == "text" and not (
                isinstance(block.get("text"), str) and block["text"].strip()
            ):
                raise InvalidInput(f"input[{i}] is a text block without text.")
            if block["type"] not in BLOCK_TYPES:
                raise InvalidInput(
                    f"input[{i}]: {block['type']} blocks cannot start a run (a run's input holds "
                    f"{', '.join(BLOCK_TYPES)} blocks)."
                )
        # The shapes the Messages API accepts, checked now rather than failing at the model.
        blocks = validate_blocks(value, where="input")
        if sum(1 for block in blocks if has_cache_control(block)) > INPUT_BREAKPOINTS:
            raise InvalidInput(
                f"At most {INPUT_BREAKPOINTS} input blocks may set cache_control: the API allows "
                "4 breakpoints a request, and the engine places 2 (tools and system)."
            )
        return blocks
    raise InvalidInput(
        "The input must be a non-empty string or a non-empty list of content blocks."
    )


def run_config(
    agent: Agent, owner: Any = None, options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The configuration snapshot a run (or a conversation) keeps: the agent's, with the
    run's own `options` (agent_options.RUN_OPTIONS) and `metadata.user_id` (an opaque id of the
    owner). InvalidInput for a bad option, OptionRefused for one the model refuses."""
    if options is not None and not isinstance(options, dict):
        raise InvalidOption("options must be a JSON object.")
    config = agent.snapshot(options, owner=owner)
    check_refusals(config, f"Agent {agent.name}")
    user_id = owner_user_id(owner)
    if user_id is not None:
        config["metadata"] = {"user_id": user_id}
    return config


def check_refusals(stored: dict[str, Any] | None, who: str) -> None:
    """OptionRefused (a 400 naming the option, the value and the model) when the model of a
    configuration snapshot refuses what its requests would send: the same rules
    (catalog.RULES) as manage.py check and the Messages API stand-in, applied before a run
    is queued (a new run, a fork, a conversation message), never left to turn 1 or turn 30."""
    config = RunConfig.of(stored)
    if not config.model:
        return
    refused = catalog.refusals(config.model, config.request_params())
    if refused:
        raise OptionRefused(f"{who}: " + "; ".join(refused) + ".")


def run_context(agent: Agent | None, context: str | None) -> tuple[str, str]:
    """A run's context: the agent's `context` hook's text (called once now: stored on the
    run, the same text goes with every turn and every replay), then the given text after
    it; and the hook's text alone (kept in the run's configuration snapshot as
    `context_hook`: the author's, like the system prompt, never shown to API clients). The
    hook's text is the author's: a caller adds to it, never replaces or blanks it."""
    if context is not None and not isinstance(context, str):
        raise InvalidInput("context must be a string.")
    check_text(context, "The context")
    hook = agent.context() if agent is not None and agent.context is not None else None
    if hook is not None and not isinstance(hook, str):
        raise InvalidInput("context must be a string (the agent's context hook returned none).")
    check_text(hook, "The agent's context")
    # A blank text block is refused by the API: blank context is no context.
    joined = "\n\n".join(text for text in (hook, context) if text and text.strip())
    return joined, hook if hook and hook.strip() else ""


def request_digest(**parts: Any) -> str:
    """A digest of what a request asked for, kept with its idempotency key: a replay of
    the key that asks for anything else is refused (IdempotencyConflict)."""
    text = json.dumps(parts, cls=StorableJSONEncoder, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def start_run(
    agent: str | Agent,
    input: Any,
    *,
    owner: Any = None,
    idempotency_key: str | None = None,
    metadata: dict[str, Any] | None = None,
    correlation_id: str | None = None,
    deadline: datetime | timedelta | None = None,
    options: dict[str, Any] | None = None,
    context: str | None = None,
    request_hash: str | None = None,
) -> Run:
    """Create a queued run of `agent` and enqueue it on commit.

    With an idempotency key, a second call with the same key (per owner) returns
    the first run instead of creating another; one that asks for anything else (agent,
    input, metadata, correlation id, deadline, options, context: `request_hash`, by
    default a digest of them) raises IdempotencyConflict. `options`: request options of
    this run (agent_options.RUN_OPTIONS, e.g. `{"effort": "low"}`) over the agent's; `context`:
    text sent after the input in the same user message (a date, a mode), never in the
    system prompt, after the text of the agent's `context` hook.
    """
    agent_obj = get_agent(agent) if isinstance(agent, str) else agent
    input = validate_input(input)
    if request_hash is None and idempotency_key is not None:
        request_hash = request_digest(
            agent=agent_obj.name,
            input=input,
            metadata=metadata or {},
            correlation_id=correlation_id or "",
            deadline=deadline,
            options=options or {},
            context=context or "",
        )
    config = run_config(agent_obj, owner, options)
    context, hook = run_context(agent_obj, context)
    if hook:
        config["context_hook"] = hook
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidInput("metadata must be a JSON object.")
    check_json(input, "The input")
    check_json(metadata, "metadata")
    check_text(correlation_id, "correlation_id")
    check_text(idempotency_key, "The idempotency key")
    if idempotency_key is not None:
        existing = _existing_run(owner, idempotency_key, agent_obj.name, input, request_hash)
        if existing is not None:
            return existing
    if isinstance(deadline, timedelta):
        deadline = timezone.now() + deadline
    elif deadline is None and agent_obj.deadline is not None:
        deadline = timezone.now() + agent_obj.deadline
    try:
        with transaction.atomic():
            run = transitions.create_run(
                Run(
                    agent=agent_obj.name,
                    input=input,
                    config=config,
                    context=context,
                    owner=owner,
                    idempotency_key=idempotency_key,
                    request_hash=request_hash or "",
                    metadata=metadata or {},
                    correlation_id=correlation_id or uuid.uuid4().hex,
                    deadline=deadline,
                )
            )
            wakeups.on_commit(run.pk)
    except IntegrityError:
        if idempotency_key is None:
            raise
        existing = _existing_run(owner, idempotency_key, agent_obj.name, input, request_hash)
        if existing is None:
            raise
        return existing
    logger.info("Run started run_id=%s agent=%s", run.pk, run.agent)
    return run


def _existing_run(
    owner: Any, key: str, agent: str, input: Any, digest: str | None = None
) -> Run | None:
    run = Run.objects.filter(owner=owner, idempotency_key=key).first()
    if run is None:
        return None
    if run.agent != agent or run.input != input or run.conversation_id:
        raise IdempotencyConflict(
            f"Idempotency key {key!r} was used for another run ({run.pk}) with a different "
            "agent or input, or in a conversation."
        )
    if digest and run.request_hash and run.request_hash != digest:
        raise IdempotencyConflict(
            f"Idempotency key {key!r} was used for run {run.pk} with a different request "
            "(its metadata, correlation id, deadline, options or context): use a new key "
            "for a new request."
        )
    return run


def _lease_live(run: Run, now: datetime) -> bool:
    return bool(run.lease_owner) and run.lease_expires_at is not None and run.lease_expires_at > now


@retry_lost_race
def cancel_run(run: Run | Any, *, by: Any = None, reason: str = "") -> Run:
    """Ask a run to stop. Applied at once when no worker holds it; otherwise the holder
    sees the request within about a second and closes the turn cleanly."""
    check_text(reason, "The reason")
    with transaction.atomic():
        run = store.lock_run(getattr(run, "pk", run))
        if run.state == RunState.CANCELLED:
            return run
        if not run.is_active:
            raise RunNotActive(f"Run {run.pk} is {run.state}: there is nothing to cancel.")
        write = store.Write(run)
        add_cancel(write, run, by=by, reason=reason)
        if write.events:
            store.send(write)
    applied = run.state == RunState.CANCELLED
    telemetry.cancel_requested(run, applied)
    logger.info("Cancel requested run_id=%s state=%s", run.pk, run.state)
    return run


def add_cancel(write: store.Write, run: Run, *, by: Any, reason: str) -> None:
    """The cancel of an active `run` (its row locked by the caller), added to `write`: the
    request, and the stop itself when no live worker holds the run (a holder sees the
    request within about a second and stops it)."""
    if run.cancel_requested_at is None:
        transitions.request_cancel(write, run, by, reason)
    if run.state in (RunState.QUEUED, RunState.AWAITING_APPROVAL) or not _lease_live(
        run, database_now()
    ):
        reason = reason or run.cancel_reason or "cancelled"
        transitions.stop_run(write, run, RunState.CANCELLED, reason)


@retry_lost_race
def resume_run(run: Run | Any, *, by: Any = None) -> Run:
    """Queue a failed, cancelled or timed-out run again; it continues from its history."""
    with transaction.atomic():
        run = store.lock_run(getattr(run, "pk", run))
        if run.conversation_id is not None:
            _resumable_in_conversation(run)
        check_refusals(run.config, f"Run {run.pk}")  # as a new run, before it is queued
        now = timezone.now()
        fields: dict[str, Any] = {
            "error_code": "",
            "error_message": "",
            "failure_phase": "",
            "stop_reason": "",
            "cancel_requested_at": None,
            "cancel_reason": "",
            "cancel_requested_by": None,
            "recovery_attempts": 0,
            "queued_at": now,
            "finished_at": None,
        }
        if run.deadline is not None and run.deadline <= now:
            # A passed deadline would end it again at once. The agent's own time limit
            # starts over; a one-off deadline given to start_run is dropped.
            limit = _agent_deadline_seconds(run)
            fields["deadline"] = now + timedelta(seconds=limit) if limit else None
        write = store.Write(run)
        transitions.resume(write, run, by, fields)
        store.send(write)
    logger.info("Run resumed run_id=%s", run.pk)
    return run


def _resumable_in_conversation(run: Run) -> None:
    """A run of a conversation resumes only as its last one: a later run's history was
    built on it as it ended, and a rolled-back run is no longer part of it."""
    later = Run.objects.filter(
        conversation_id=run.conversation_id, conversation_position__gt=run.conversation_position
    )
    if run.rolled_back or later.exists():
        why = (
            "it was rolled back"
            if run.rolled_back
            else "a later run of its conversation follows it"
        )
        raise InvalidTransition(
            f"Run {run.pk} cannot be resumed: {why}. Send the conversation a new message instead."
        )


def _agent_deadline_seconds(run: Run) -> float | None:
    """The agent's time limit for a run, from its configuration snapshot (runs created
    before it was snapshotted: the agent as registered now)."""
    config = RunConfig.of(run.config)
    if config.deadline_snapshotted:
        return config.deadline_seconds
    try:
        deadline = get_agent(run.agent).deadline
    except UnknownAgent:
        return None
    return deadline.total_seconds() if deadline else None
