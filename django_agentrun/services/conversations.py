"""Conversations: start one, send it a message (a new run whose history is the earlier
runs' transcripts, then the new input), stop it.

A conversation keeps the agent's configuration as it was when it started (the system
prompt and the tools never change during it: current models refuse a history whose
thinking blocks were made under another prefix), and every run of it uses that snapshot.
A message sent while a run of it is active follows a policy (`ConversationPolicy`):
`reject`, `enqueue` (the new run starts once the earlier ones have ended: the claim holds
it back until then), `interrupt` (the active runs are cancelled as `cancel_run` cancels
them) or `rollback` (as interrupt, and the interrupted runs leave the history).
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from .. import store, transitions, wakeups
from ..agents import Agent, get_agent, registered_agents
from ..exceptions import ConversationBusy, IdempotencyConflict, InvalidInput
from ..fields import check_json, check_text
from ..models import Conversation, Run
from ..runconfig import RunConfig
from ..states import RUN_ACTIVE, ConversationPolicy
from .retrying import retry_lost_race
from .runs import (
    add_cancel,
    check_refusals,
    request_digest,
    run_config,
    run_context,
    validate_input,
)

logger = logging.getLogger(__name__)

INTERRUPTED = "interrupted by a new message"
ROLLED_BACK = "rolled back by a new message"
STOPPED = "the conversation was stopped"


def _policy(value: Any) -> str:
    if value not in ConversationPolicy.values:
        raise InvalidInput(
            f"Unknown policy {value!r}: one of {', '.join(ConversationPolicy.values)}."
        )
    return str(value)


def _metadata(value: Any) -> dict[str, Any]:
    if value is not None and not isinstance(value, dict):
        raise InvalidInput("metadata must be a JSON object.")
    check_json(value, "metadata")
    return value or {}


def start_conversation(
    agent: str | Agent,
    *,
    owner: Any = None,
    policy: str = ConversationPolicy.ENQUEUE,
    metadata: dict[str, Any] | None = None,
) -> Conversation:
    """A new conversation with `agent` (by name), keeping a snapshot of its configuration:
    every run of the conversation uses it, whatever the agent becomes later. `policy` is
    what becomes of a message sent while a run is active, unless the message says."""
    agent_obj = get_agent(agent) if isinstance(agent, str) else agent
    conversation = Conversation.objects.create(
        agent=agent_obj.name,
        config=run_config(agent_obj, owner),
        owner=owner,
        policy=_policy(policy),
        metadata=_metadata(metadata),
    )
    logger.info("Conversation started conversation_id=%s agent=%s", conversation.pk, agent_obj.name)
    return conversation


@retry_lost_race
def send_message(
    conversation: Conversation | Any,
    input: Any,
    *,
    policy: str | None = None,
    context: str | None = None,
    idempotency_key: str | None = None,
    metadata: dict[str, Any] | None = None,
    by: Any = None,
    request_hash: str | None = None,
) -> Run:
    """Start the conversation's next run: its history is the earlier runs' (rolled-back
    ones left out), then `input`, then `context` (a text block of the same user message:
    per-message context such as the date, never in the system prompt). It belongs to the
    conversation's owner and is queued and woken on commit; it starts once every earlier
    run has ended.

    While a run is active, `policy` (default: the conversation's) decides: `reject` raises
    ConversationBusy; `enqueue` leaves the new run waiting; `interrupt` cancels the active
    runs (a worker holding one stops it within about a second); `rollback` also leaves
    them out of the history from now on. With an idempotency key (unique per owner, as
    for runs) a repeated message returns the first run and changes nothing."""
    input = validate_input(input)
    check_text(idempotency_key, "The idempotency key")
    metadata = _metadata(metadata)
    chosen = _policy(policy) if policy is not None else None
    if request_hash is None and idempotency_key is not None:
        request_hash = request_digest(
            conversation=str(getattr(conversation, "pk", conversation)),
            input=input,
            context=context or "",
            metadata=metadata,
            policy=chosen,
        )
    # The agent's context hook (a date, a mode) runs for every message, its text first.
    name = getattr(conversation, "agent", None)
    if name is None:
        name = Conversation.objects.filter(pk=conversation).values_list("agent", flat=True)
        name = name.first()
    context, hook = run_context(registered_agents().get(name or ""), context)
    with transaction.atomic():
        # Serialises the messages of one conversation: positions, policies and keys.
        conversation = store.lock_conversation(getattr(conversation, "pk", conversation))
        if idempotency_key is not None:
            existing = _existing(conversation, idempotency_key, input, request_hash)
            if existing is not None:
                return existing
        chosen = chosen or conversation.policy
        get_agent(conversation.agent)  # its tools must still be there to run
        # Its options are fixed at its start (with thinking between_tools the effort may
        # not change within a conversation); a snapshot the model now refuses is a 400.
        check_refusals(conversation.config, f"Conversation {conversation.pk}")
        # The lock order (store/locks.py): the conversation, then its runs by position.
        active = store.lock_active_runs(conversation, RUN_ACTIVE)
        if active and chosen == ConversationPolicy.REJECT:
            raise ConversationBusy(
                f"Conversation {conversation.pk} is busy: run {active[0].pk} is "
                f"{active[0].state} (policy reject)."
            )
        try:
            with transaction.atomic():
                run = _new_run(
                    conversation,
                    input,
                    context,
                    idempotency_key,
                    metadata,
                    request_hash or "",
                    hook,
                )
        except IntegrityError:
            existing = idempotency_key and _existing(
                conversation, idempotency_key, input, request_hash
            )
            if not existing:
                raise
            return existing
        if chosen in (ConversationPolicy.INTERRUPT, ConversationPolicy.ROLLBACK):
            rollback = chosen == ConversationPolicy.ROLLBACK
            for earlier in active:
                _interrupt(earlier, run, by=by, rollback=rollback)
        Conversation.objects.filter(pk=conversation.pk).update(updated_at=timezone.now())
        # Held back by its claim while an earlier run is active; the transition that ends
        # the last of them wakes it again.
        wakeups.on_commit(run.pk)
    logger.info(
        "Message sent conversation_id=%s run_id=%s position=%s policy=%s active=%s",
        conversation.pk,
        run.pk,
        run.conversation_position,
        chosen,
        len(active),
    )
    return run


def _new_run(
    conversation: Conversation,
    input: Any,
    context: str,
    key: str | None,
    metadata: dict[str, Any],
    request_hash: str = "",
    hook: str = "",
) -> Run:
    last = conversation.runs.aggregate(last=Max("conversation_position"))["last"]
    limit = RunConfig.of(conversation.config).deadline_seconds
    return transitions.create_run(
        Run(
            agent=conversation.agent,
            input=input,
            context=context,
            # The context hook's text of this message, as a run started alone keeps it.
            config={**conversation.config, "context_hook": hook} if hook else conversation.config,
            owner=conversation.owner,
            idempotency_key=key,
            request_hash=request_hash,
            metadata=metadata,
            correlation_id=uuid.uuid4().hex,
            deadline=timezone.now() + timedelta(seconds=limit) if limit else None,
            conversation=conversation,
            conversation_position=0 if last is None else last + 1,
        )
    )


def _existing(conversation: Conversation, key: str, input: Any, digest: str | None) -> Run | None:
    run = Run.objects.filter(owner=conversation.owner, idempotency_key=key).first()
    if run is not None and (
        run.conversation_id != conversation.pk
        or run.input != input
        or (digest and run.request_hash and run.request_hash != digest)
    ):
        raise IdempotencyConflict(
            f"Idempotency key {key!r} was used for another run ({run.pk}) with a different "
            "conversation or message (input, context, metadata or policy): use a new key for "
            "a new message."
        )
    return run


def _interrupt(run: Run, next_run: Run, *, by: Any, rollback: bool) -> None:
    """Cancel an active run of the conversation (as cancel_run does), rolled back with it."""
    write = store.Write(run)
    if run.is_active:
        add_cancel(write, run, by=by, reason=ROLLED_BACK if rollback else INTERRUPTED)
    if rollback:
        transitions.roll_back(write, run, by, next_run.pk)
    if write.events:
        store.send(write)


@retry_lost_race
def stop_conversation(
    conversation: Conversation | Any, *, by: Any = None, reason: str = ""
) -> Conversation:
    """Cancel every active run of the conversation, the running one and the queued ones
    (as cancel_run cancels them: a worker holding one stops it within about a second).
    Stopping a conversation with no active run changes nothing."""
    check_text(reason, "The reason")
    with transaction.atomic():
        conversation = store.lock_conversation(getattr(conversation, "pk", conversation))
        for run in store.lock_active_runs(conversation, RUN_ACTIVE):
            write = store.Write(run)
            add_cancel(write, run, by=by, reason=reason or STOPPED)
            if write.events:
                store.send(write)
    logger.info("Conversation stopped conversation_id=%s", conversation.pk)
    return conversation
