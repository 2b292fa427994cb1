"""One step of a run: claim, decide from the database, one model call or the open
tool calls, commit each step write-ahead, release and enqueue the next.

Commits per turn with k tool calls: claim+turn_started, the response (intent),
then in_flight and result per call (2k); closing the turn rides on the last one.
"""

from __future__ import annotations

import logging
import random
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from .. import services, signals
from ..abort import CANCEL_REQUESTED, AbortSignal
from ..agents import Agent, get_agent
from ..clients import (
    ModelClient,
    ModelError,
    ModelRequest,
    ModelResponse,
    StreamAborted,
    get_model_client,
)
from ..conf import agentrun_settings
from ..content import stored_result
from ..exceptions import InvalidContent, LeaseLost, ToolCancelled, ToolError, UnknownAgent
from ..failpoints import failpoint
from ..fields import storable_text
from ..identity import holder_is_dead, worker_identity
from ..models import Run, ToolCall, Turn, idempotency_key_for
from ..services import Event, Lease, _close_call, _save, _set_state, fenced
from ..states import ResultSource, RunState, SideEffect, ToolCallState, TurnState
from ..tools import Tool, ToolArgumentsError, ToolContext, arguments_hash
from . import guards
from .heartbeat import Heartbeat
from .history import TurnRecord, build_messages, model_failure, sanitize_content, text_of

logger = logging.getLogger(__name__)


class Outcome:
    NOT_CLAIMED = "not_claimed"
    CONTINUED = "continued"
    PARKED = "parked"
    FINISHED = "finished"
    LEASE_LOST = "lease_lost"


class _Stop(Exception):  # noqa: N818
    """Internal: the step ended; the outcome is recorded (raised after the commit)."""

    def __init__(self, outcome: str) -> None:
        super().__init__(outcome)
        self.outcome = outcome


def advance(
    run_id: Any,
    *,
    owner: str | None = None,
    abort: AbortSignal | None = None,
    client: ModelClient | None = None,
    heartbeat: bool = False,
) -> str:
    """Advance the run by at most one turn. Safe to call twice at once: one claims it."""
    step = _Step(run_id, owner or worker_identity(), abort or AbortSignal(), client)
    return _drive(step, heartbeat=heartbeat)


def recover_in_flight(run_id: Any, *, steal_from: str | None = None) -> str:
    """The reaper's half of recovery: claim an expired lease, apply the side-effect
    policy to in_flight calls (re-run allowed, reconcile, or unknown), wake a worker."""
    owner = f"reaper:{worker_identity()}"
    step = _Step(run_id, owner, AbortSignal(), None, recover_only=True, steal_from=steal_from)
    # With a heartbeat: a reconcile check sees a cancel, and stops before the lease expires.
    return _drive(step, heartbeat=True)


def _drive(step: _Step, *, heartbeat: bool = False) -> str:
    """Claim, run the step under the lease (with a heartbeat if asked), release."""
    lease = step.claim()
    if lease is None:
        return Outcome.NOT_CLAIMED
    beat = None
    if heartbeat:
        beat = Heartbeat(lease, step.abort)
        beat.start()
    try:
        return step.run()
    except LeaseLost:
        logger.warning("Lease lost run_id=%s epoch=%s", step.run_id, lease.epoch)
        return Outcome.LEASE_LOST
    except Exception:
        # Treat it like a crash: the lease lapses, the reaper recovers the run and counts
        # the recovery, so a poison step ends as recovery_exhausted instead of looping.
        logger.exception("Advancing failed run_id=%s epoch=%s", step.run_id, lease.epoch)
        step.released = True
        raise
    finally:
        if beat is not None:
            beat.stop()
        if not step.released and services.release_lease(lease):
            # Still ours (the step stopped without finishing, e.g. its heartbeat could not
            # renew for a while): the run must not wait for the stale sweep.
            services.enqueue_advance(step.run_id)


class _Step:
    def __init__(
        self,
        run_id: Any,
        owner: str,
        abort: AbortSignal,
        client: ModelClient | None,
        *,
        recover_only: bool = False,
        steal_from: str | None = None,
    ):
        self.recover_only = recover_only
        # Turn/tool-call updates deferred to the next run write of the same transaction.
        self._rows: list[services.Deferred] = []
        self.steal_from = steal_from
        self.run_id = run_id
        self.owner = owner
        self.abort = abort
        self._client = client
        self.lease: Lease | None = None
        self.released = False
        self.run_obj: Run
        self.turns: list[Turn] = []
        self.agent: Agent | None = None
        self.outcome = Outcome.CONTINUED
        self.turn: Turn | None = None
        self._cancel_seen = False
        self._started: ToolCall | None = None  # in_flight, its handler not yet run
        self._not_started: set[Any] = set()  # pks of in_flight calls whose handler never ran
        self._interrupting = False
        self.took_over = False

    @contextmanager
    def _tx(self, *, lazy: bool = True):
        """A write unit (services.write_unit; a plain transaction.atomic() when not
        `lazy`, e.g. to lock rows first) that commits when the step ends inside it
        (_Stop), then re-raises. A cancel request seen by its writes fires the abort signal."""
        stop: _Stop | None = None
        self._rows = []
        self._cancel_seen = False
        with services.write_unit() if lazy else transaction.atomic() as unit:
            try:
                yield
            except _Stop as exc:
                stop = exc
            services._flush(self._rows)  # deferred but never sent with a run write
        if self._cancel_seen or (unit is not None and unit.cancel_requested):
            self.abort.abort(CANCEL_REQUESTED)
        if self.abort.aborted and not self._interrupting:
            if not self.released:
                # Seen by this commit or meanwhile: nothing more starts (no handler, no
                # turn); the step closes the run now.
                self._interrupted()
            elif (
                self.abort.reason == CANCEL_REQUESTED
                and self.run_obj.state == RunState.AWAITING_APPROVAL
            ):
                # The cancel arrived as the run parked: nobody holds it now, so it applies
                # at once instead of waiting for a person. (A run released to go on is
                # cancelled by the worker that claims it next.)
                services.cancel_run(self.run_id)
                raise _Stop(Outcome.FINISHED) from None
        if stop is not None:
            raise stop

    # ----------------------------------------------------------------- claim

    def claim(self) -> Lease | None:
        with transaction.atomic():  # noqa: SIM117 - _Stop is caught inside, so this commits
            claimed = services.claim_and_load(self.run_id, self.owner, steal_from=self.steal_from)
            if claimed is None:
                holder = (
                    Run.objects.filter(pk=self.run_id).values_list("lease_owner", flat=True).first()
                )
                if holder and holder_is_dead(holder):
                    claimed = services.claim_and_load(self.run_id, self.owner, steal_from=holder)
                    if claimed is not None:
                        logger.info(
                            "Took over the lease of dead process %s run_id=%s", holder, self.run_id
                        )
            if claimed is None:
                return None
            lease, self.run_obj = claimed.lease, claimed.run
            self.lease, self.took_over = lease, claimed.took_over
            self._load(claimed)
            try:
                self._decide_at_claim()
            except _Stop as stop:
                self.outcome = stop.outcome
                self.released = stop.outcome in (Outcome.FINISHED, Outcome.PARKED)
                self._stopped = True
            else:
                self._stopped = False
            services._flush(self._rows)  # deferred but never sent with a run write
        failpoint("claim.after_commit")
        return lease

    def _load(self, claimed: services.Claimed) -> None:
        """The run's turns, each with its tool calls."""
        self.turns = claimed.turns
        calls_by_turn: dict[int, list[ToolCall]] = {}
        for call in claimed.calls:
            calls_by_turn.setdefault(call.turn_index, []).append(call)
        for turn in self.turns:
            turn.calls = calls_by_turn.get(turn.index, [])  # type: ignore[attr-defined]

    @property
    def config(self) -> dict[str, Any]:
        return self.run_obj.config

    def _decide_at_claim(self) -> None:
        run = self.run_obj
        events: list[Event] = []
        if self.took_over:
            # This claim took the lease from a holder that never released it: one event
            # per recovery (recovery_attempts counts them since the last completed turn).
            events.append(
                ("recovery", {"attempts": run.recovery_attempts, "epoch": self.lease.epoch})
            )
        self._check_interrupts(events)
        if run.state == RunState.QUEUED:
            old = _set_state(run, RunState.RUNNING)
            events.append(("run_started", {"run_state": run.state, "worker": self.owner}))
            self._fenced(
                events, old_state=old, fields={"started_at": run.started_at or timezone.now()}
            )
            events = []
        if run.recovery_attempts > agentrun_settings.MAX_RECOVERY_ATTEMPTS:
            self._fail(
                "recovery_exhausted",
                f"The run was recovered {run.recovery_attempts} times after crashes; giving up "
                "(AGENTRUN_MAX_RECOVERY_ATTEMPTS).",
                "recovery",
                events,
            )
        try:
            self.agent = get_agent(run.agent)
        except UnknownAgent as exc:
            self._fail("unknown_agent", str(exc), "pre_turn", events)
        last = self.turns[-1] if self.turns else None
        if last is not None and last.state in (TurnState.RUNNING, TurnState.AWAITING_TOOL):
            # RUNNING: the model was asked but its answer never committed: ask again.
            self.turn = last
        elif not self.recover_only:
            self._begin_turn(events)
        if events:
            self._fenced(events)

    def _check_interrupts(self, events: list[Event]) -> None:
        run = self.run_obj
        if run.cancel_requested_at is not None:
            self._close(RunState.CANCELLED, run.cancel_reason or "cancelled", events)
        if run.deadline is not None and run.deadline <= timezone.now():
            self._close(RunState.TIMED_OUT, "deadline passed", events)

    def _begin_turn(self, events: list[Event]) -> None:
        run = self.run_obj
        answered = sum(1 for t in self.turns if t.content is not None)
        max_turns = self.config.get("max_turns") or agentrun_settings.DEFAULT_MAX_TURNS
        if answered >= max_turns:
            self._complete("max_turns", events)
        budget = self.config.get("budget") or {}
        if budget:
            breach = guards.check_budget(
                budget,
                model=self.config["model"],
                totals=run.usage(),
                cost_usd=run.cost_usd,
                next_prompt_tokens=self._estimate_next_prompt(),
                max_tokens=self.config.get("max_tokens") or agentrun_settings.DEFAULT_MAX_TOKENS,
            )
            if breach is not None:
                events.append(
                    (
                        "budget_exceeded",
                        {
                            "limit": breach.limit,
                            "projected": breach.projected,
                            "allowed": breach.allowed,
                        },
                    )
                )
                self._fail("budget_exceeded", breach.message(), "pre_turn", events)
        index = self.turns[-1].index + 1 if self.turns else 0
        turn = Turn(run=run, index=index, is_final=answered == max_turns - 1)
        services.insert_rows([turn], defer=self._rows)
        turn.calls = []  # type: ignore[attr-defined]
        self.turns.append(turn)
        self.turn = turn
        events.append(
            (
                "turn_started",
                {"turn_index": index, "turn_state": turn.state, "final": turn.is_final},
            )
        )

    def _estimate_next_prompt(self) -> int:
        answered = [t for t in self.turns if t.content is not None]
        if not answered:
            return guards.estimate_tokens(
                [self.config.get("system", ""), self.config.get("tools", []), self.run_obj.input]
            )
        last = answered[-1]
        # The results as the model will see them (media priced as the API bills it).
        added = sum(
            guards.estimate_tokens(c.tool_result_block()["content"])
            for c in last.calls  # type: ignore[attr-defined]
            if c.is_closed
        )
        prompt = last.input_tokens + last.cache_creation_input_tokens + last.cache_read_input_tokens
        return prompt + last.output_tokens + added

    # ----------------------------------------------------------------- run

    def run(self) -> str:
        if self._stopped:
            return self.outcome
        try:
            turn = self.turn
            if self.recover_only:
                self._recover_only(turn)
            assert turn is not None
            if turn.state == TurnState.RUNNING:
                self._model_step(turn)
            if turn.state == TurnState.AWAITING_TOOL:
                self._tools_step(turn)
        except _Stop as stop:
            return stop.outcome
        return self.outcome

    # ----------------------------------------------------------------- model

    @property
    def client(self) -> ModelClient:
        if self._client is None:
            self._client = get_model_client()
        return self._client

    def _request(self, turn: Turn) -> ModelRequest:
        config = self.config
        system: list[dict[str, Any]] = []
        if config.get("system"):
            system.append({"type": "text", "text": config["system"]})
        tool_choice = None
        if turn.is_final:
            system.append({"type": "text", "text": guards.FINAL_TURN_NOTICE})
            tool_choice = {"type": "none"} if config.get("tools") else None
        return ModelRequest(
            model=config["model"],
            messages=build_messages(self.run_obj.input, self._records()),
            max_tokens=config.get("max_tokens") or agentrun_settings.DEFAULT_MAX_TOKENS,
            system=system,
            tools=list(config.get("tools") or []),
            tool_choice=tool_choice,
            cache_prefix=bool(config.get("prompt_caching", True)),
        )

    def _records(self) -> list[TurnRecord]:
        return [
            TurnRecord(
                index=t.index,
                content=t.content,
                results=[c.tool_result_block() for c in t.calls if c.is_closed],  # type: ignore[attr-defined]
            )
            for t in self.turns
        ]

    def _call_model(self, request: ModelRequest) -> tuple[ModelResponse, int]:
        retries = agentrun_settings.MODEL_RETRIES
        for attempt in range(retries + 1):
            if self.abort.aborted:
                raise StreamAborted(self.abort.reason)
            try:
                return _complete(self.client.create(request, abort=self.abort)), attempt
            except ModelError as exc:
                if not exc.retryable or attempt == retries:
                    raise
                base = agentrun_settings.MODEL_RETRY_BASE_SECONDS * (2**attempt)
                delay = min(
                    max(exc.retry_after or 0.0, base), agentrun_settings.MODEL_RETRY_MAX_SECONDS
                )
                delay *= 1 + random.random() * 0.1
                logger.warning(
                    "Model call failed (status=%s), retrying in %.1fs run_id=%s",
                    exc.status,
                    delay,
                    self.run_id,
                )
                if self.abort.wait(delay):
                    raise StreamAborted(self.abort.reason) from exc
        raise AssertionError("unreachable")

    def _model_step(self, turn: Turn) -> None:
        try:
            response, retries = self._call_model(self._request(turn))
        except StreamAborted:
            self._interrupted()
            raise AssertionError("unreachable") from None
        except ModelError as exc:
            with self._tx():
                code, message = model_failure(exc)
                self._fail(code, message[:2000], "model", [], turn=turn)
        failpoint("model.before_commit")
        with self._tx():
            self._record_response(turn, response, retries)
        failpoint("model.after_commit")

    def _record_response(self, turn: Turn, response: ModelResponse, retries: int) -> None:
        run = self.run_obj
        content = sanitize_content(response.content)
        usage = response.usage.as_dict()
        cost = guards.cost_of(self.config["model"], usage)
        now = timezone.now()
        stop = response.stop_reason
        blocks = [b for b in content if b.get("type") == "tool_use"]
        truncated_id = (
            content[-1].get("id")
            if stop in ("max_tokens", "model_context_window_exceeded")
            and content
            and content[-1].get("type") == "tool_use"
            else None
        )
        old_turn = turn.state
        events: list[Event] = [
            (
                "model_response",
                {
                    "turn_index": turn.index,
                    "message_id": response.message_id,
                    "request_id": response.request_id,
                    "model": response.model,
                    "stop_reason": stop,
                    "content": content,
                    "usage": usage,
                    "cost_usd": str(cost),
                },
            )
        ]
        ids = [b.get("id") for b in blocks]
        earlier = {c.tool_call_id for t in self.turns for c in t.calls}  # type: ignore[attr-defined]
        if not all(ids) or len(set(ids)) != len(ids) or earlier.intersection(ids):
            # Unanswerable: results could not be matched to calls, and the API would refuse
            # this content in the history. Keep it in the event only and stop here.
            events[0][1]["discarded"] = True
            _save(
                turn,
                None,
                message_id=response.message_id,
                request_id=response.request_id,
                stop_reason=stop,
                **usage,
            )
            self._fail(
                "invalid_model_output",
                "The model returned tool_use blocks with missing, duplicate or reused ids; the response "
                "was recorded (and paid for) but not used.",
                "model",
                events,
                turn=turn,
                incr={**usage, "cost_usd": cost},
            )
        calls = self._intents(turn, blocks, truncated_id, events)
        services.insert_rows(calls, defer=self._rows)
        turn.calls = calls  # type: ignore[attr-defined]
        turn.content = content
        _set_state(turn, TurnState.AWAITING_TOOL if calls else TurnState.COMPLETED)
        events[0][1]["turn_state"] = turn.state
        turn_fields: dict[str, Any] = dict(
            content=content,
            message_id=response.message_id,
            request_id=response.request_id,
            model=response.model,
            stop_reason=stop,
            model_attempts=retries + 1,
            **usage,
        )
        if not calls:
            turn_fields["finished_at"] = now
        _save(turn, old_turn, defer=self._rows, **turn_fields)
        incr = {**usage, "cost_usd": cost, "turn_count": 1}
        # Usage is counted here, once per recorded response.
        if stop == "model_context_window_exceeded":
            self._fail(
                "context_window_exceeded",
                "The conversation no longer fits the model's context window.",
                "model",
                events,
                turn=turn,
                incr=incr,
            )
        if calls and all(c.is_closed for c in calls):
            self._close_turn(turn, events, incr=incr)
        elif calls:
            old = _set_state(run, RunState.AWAITING_TOOL)
            events[0][1]["run_state"] = run.state
            self._fenced(events, old_state=old, incr=incr, last=True)
        else:
            self._turn_without_tools(turn, stop, events, incr)

    def _turn_without_tools(self, turn: Turn, stop: str, events: list[Event], incr: dict) -> None:
        events.append(("turn_completed", {"turn_index": turn.index, "turn_state": turn.state}))
        if turn.is_final:
            self._complete("max_turns", events, incr=incr)
        if stop == "pause_turn":
            self._continue(events, incr=incr)
        self._complete(stop, events, incr=incr)

    def _intents(
        self,
        turn: Turn,
        blocks: list[dict[str, Any]],
        truncated_id: str | None,
        events: list[Event],
    ) -> list[ToolCall]:
        """The write-ahead intent: one ToolCall per tool_use block. Calls a guard
        intercepts are closed at once with a synthetic is_error result."""
        run = self.run_obj
        agent = self.agent
        cap = (
            self.config.get("max_tool_calls_per_turn")
            or agentrun_settings.DEFAULT_MAX_TOOL_CALLS_PER_TURN
        )
        threshold = self.config.get("repeat_threshold") or agentrun_settings.REPEAT_THRESHOLD
        window = self.config.get("repeat_window") or agentrun_settings.REPEAT_WINDOW
        history = [c.arguments_hash for t in self.turns for c in t.calls]  # type: ignore[attr-defined]
        calls: list[ToolCall] = []
        now = timezone.now()
        for position, block in enumerate(blocks):
            name = str(block.get("name", ""))
            raw = block.get("input") if isinstance(block.get("input"), dict) else {}
            tool = self._tool(name)
            error: str | None = None
            state = ToolCallState.REQUESTED
            arguments: dict[str, Any] = raw
            if block.get("id") == truncated_id:
                state, error = (
                    ToolCallState.ERRORED,
                    (
                        "This tool call was cut off by the max_tokens limit, so its arguments are "
                        "incomplete; it was not run. Make the call again with shorter arguments."
                    ),
                )
            elif turn.is_final:
                state, error = (
                    ToolCallState.SKIPPED,
                    (
                        "Not run: the turn limit of this run is reached and no more tools may be "
                        "called. Answer with what you have."
                    ),
                )
            elif tool is None:
                available = ", ".join(agent.tools) if agent and agent.tools else "none"
                state, error = (
                    ToolCallState.ERRORED,
                    f"Unknown tool {name!r}. Available tools: {available}.",
                )
            elif position >= cap:
                state, error = (
                    ToolCallState.SKIPPED,
                    (
                        f"Not run: at most {cap} tool calls are allowed per turn "
                        f"(max_tool_calls_per_turn); this was call {position + 1}."
                    ),
                )
            else:
                try:
                    arguments = tool.validate(raw)
                except ToolArgumentsError as exc:
                    state, error = (
                        ToolCallState.ERRORED,
                        f"{exc} The tool was not run; fix the arguments and try again.",
                    )
            digest = arguments_hash(name, arguments)
            if state == ToolCallState.REQUESTED and guards.repeated(
                history, digest, threshold, window
            ):
                state, error = (
                    ToolCallState.SKIPPED,
                    (
                        f"Not run: this is the {threshold}th identical call of {name} with the same "
                        f"arguments within the last {max(window, threshold)} calls. Repeating it "
                        "will not help; try a different strategy or answer with what you have."
                    ),
                )
                events.append(
                    (
                        "loop_detected",
                        {
                            "turn_index": turn.index,
                            "tool_call_id": block.get("id"),
                            "name": name,
                            "count": threshold,
                        },
                    )
                )
            history.append(digest)
            call = ToolCall(
                run=run,
                turn=turn,
                turn_index=turn.index,
                tool_call_id=str(block.get("id", "")),
                position=position,
                name=name,
                arguments=arguments,
                arguments_hash=digest,
                side_effect=tool.side_effect if tool else SideEffect.READ_ONLY,
                idempotency_key=idempotency_key_for(run.pk, str(block.get("id", ""))),
                state=state,
                created_at=now,
            )
            events.append(
                (
                    "tool_call_requested",
                    {
                        "turn_index": turn.index,
                        "tool_call_id": call.tool_call_id,
                        "position": position,
                        "name": name,
                        "arguments": arguments,
                        "arguments_hash": digest,
                        "side_effect": str(call.side_effect),
                        "idempotency_key": call.idempotency_key,
                        "tool_call_state": ToolCallState.REQUESTED,
                    },
                )
            )
            if error is not None:
                call.result, call.is_error, call.result_source, call.finished_at = (
                    error,
                    True,
                    ResultSource.SYNTHETIC,
                    now,
                )
                events.append(
                    (
                        "tool_call_finished",
                        {
                            "turn_index": turn.index,
                            "tool_call_id": call.tool_call_id,
                            "tool_call_state": state,
                            "result": error,
                            "is_error": True,
                            "source": ResultSource.SYNTHETIC,
                        },
                    )
                )
            calls.append(call)
        return calls

    # ----------------------------------------------------------------- tools

    def _tool(self, name: str) -> Tool | None:
        """The agent's tool of that name (None: no longer defined, or the agent is gone)."""
        return self.agent.tools.get(name) if self.agent else None

    def _tools_step(self, turn: Turn) -> None:
        for call in turn.calls:  # type: ignore[attr-defined]
            if call.is_closed:
                continue  # replay: its result is recorded
            tool = self._tool(call.name)
            if call is self._started:  # went in_flight with the previous call's result
                self._started = None
                self._run_handler(turn, call, tool)
                continue
            self._check_abort()
            if call.state == ToolCallState.UNKNOWN:
                self._park_unknown(call, call.unknown_reason, already=True)
            if call.state == ToolCallState.AWAITING_APPROVAL:
                self._park_approval(call, tool, already=True)
            if call.state == ToolCallState.IN_FLIGHT:
                self._recover(turn, call, tool)
                if call.is_closed:
                    continue
            if call.state == ToolCallState.REQUESTED:
                if tool is None:
                    self._finish(
                        turn,
                        call,
                        ToolCallState.ERRORED,
                        f"Tool {call.name} is no longer available.",
                        True,
                        ResultSource.SYNTHETIC,
                    )
                    continue
                if not call.approved and tool.needs_approval(call.arguments, self.run_obj):
                    self._park_approval(call, tool)
                self._execute(turn, call, tool)
        # Every call is closed but the turn is not (a person closed the last one): close it.
        with self._tx():
            self._close_turn(turn, [])

    def _check_abort(self) -> None:
        if self.abort.aborted:
            self._interrupted()
        if self.run_obj.deadline is not None and self.run_obj.deadline <= timezone.now():
            with self._tx():
                self._close(RunState.TIMED_OUT, "deadline passed", [])

    def _ctx(self, call: ToolCall) -> ToolContext:
        def beat() -> None:
            ToolCall.objects.filter(pk=call.pk).update(heartbeat_at=timezone.now())

        return ToolContext(
            run_id=self.run_obj.pk,
            tool_call_id=call.tool_call_id,
            idempotency_key=call.idempotency_key,
            attempt=call.attempt,
            tool_name=call.name,
            abort=self.abort,
            heartbeat=beat,
        )

    def _invoke(self, tool: Tool, call: ToolCall) -> tuple[str, Any, bool]:
        """Run the handler; every outcome becomes a (state, result, is_error) triple."""
        try:
            value = tool.invoke(self._ctx(call), call.arguments)
        except ToolCancelled as exc:
            return ToolCallState.CANCELLED, f"Cancelled while running: {exc}", True
        except InvalidContent as exc:  # e.g. a ToolResult with a bad block: the handler's bug
            return ToolCallState.ERRORED, _bad_result(call, exc), True
        except ToolError as exc:
            return ToolCallState.ERRORED, str(exc), True
        except Exception as exc:  # noqa: BLE001 - a tool bug becomes an is_error result
            logger.exception(
                "Tool %s raised run_id=%s tool_call_id=%s",
                call.name,
                self.run_id,
                call.tool_call_id,
            )
            return (
                ToolCallState.ERRORED,
                f"Tool {call.name} failed with {type(exc).__name__}.",
                True,
            )
        try:
            return ToolCallState.SUCCEEDED, stored_result(value), False
        except InvalidContent as exc:
            return ToolCallState.ERRORED, _bad_result(call, exc), True

    def _execute(self, turn: Turn, call: ToolCall, tool: Tool) -> None:
        if tool.side_effect == SideEffect.ATOMIC:
            self._execute_atomic(turn, call, tool)
            return
        with self._tx():
            self._fenced(self._start(call), last=True)
        self._run_handler(turn, call, tool)

    def _start(self, call: ToolCall) -> list[Event]:
        """The call goes in_flight (deferred to the unit's run write); returns its event."""
        old = _set_state(call, ToolCallState.IN_FLIGHT)
        self._not_started.add(call.pk)
        now = timezone.now()
        _save(
            call, old, defer=self._rows, attempt=call.attempt + 1, started_at=now, heartbeat_at=now
        )
        return [
            (
                "tool_call_started",
                {
                    "turn_index": call.turn_index,
                    "tool_call_id": call.tool_call_id,
                    "attempt": call.attempt,
                    "tool_call_state": call.state,
                },
            )
        ]

    def _next_to_start(self, turn: Turn) -> ToolCall | None:
        """The turn's next open call, if it may go in_flight in the commit that records the
        result before it: requested, its tool defined and not atomic, no approval needed,
        no abort or passed deadline. (Both are durable before its handler starts, which
        is all write-ahead asks; it saves a commit per call.)"""
        if self.recover_only:  # the reaper's step runs no handler
            return None
        call = next((c for c in turn.calls if not c.is_closed), None)  # type: ignore[attr-defined]
        if call is None or call.state != ToolCallState.REQUESTED or self.abort.aborted:
            return None
        deadline = self.run_obj.deadline
        if deadline is not None and deadline <= timezone.now():
            return None
        tool = self._tool(call.name)
        if tool is None or tool.side_effect == SideEffect.ATOMIC:
            return None
        try:
            if not call.approved and tool.needs_approval(call.arguments, self.run_obj):
                return None
        except Exception:  # noqa: BLE001 - let the loop meet it, after this result commits
            return None
        return call

    def _run_handler(self, turn: Turn, call: ToolCall, tool: Tool) -> None:
        """Run an in_flight call's handler and record its result."""
        failpoint("tool.before_handler", call.name)
        if self.abort.aborted:  # no handler starts once a cancel (or a lost lease) is known
            self._interrupted()
        self._not_started.discard(call.pk)
        state, result, is_error = self._invoke(tool, call)
        failpoint("tool.after_handler", call.name)
        if state == ToolCallState.CANCELLED and self.abort.reason != CANCEL_REQUESTED:
            # Stopped because this worker could not keep its lease, not by a cancel: its
            # outcome is unknown. Record nothing; recovery applies the side-effect policy.
            raise LeaseLost(f"Run {self.run_id}: handler stopped ({self.abort.reason})")
        self._finish(turn, call, state, result, is_error, ResultSource.EXECUTED)
        failpoint("tool.after_commit", call.name)
        if state == ToolCallState.CANCELLED:
            self._interrupted()

    def _execute_atomic(self, turn: Turn, call: ToolCall, tool: Tool) -> None:
        """ORM-only handler inside the transaction that records its result: exactly once."""
        with self._tx(lazy=False):
            # Lock the run row under the lease before running anything.
            if (
                not Run.objects.select_for_update()
                .filter(pk=self.run_id, lease_epoch=self.lease.epoch, lease_owner=self.lease.owner)
                .exists()
            ):
                raise LeaseLost(f"Run {self.run_id}: lease lost before an atomic tool")
            try:
                with transaction.atomic():
                    state, result, is_error = self._invoke(tool, call)
                    if is_error:
                        raise _RollbackTool(state, result)
            except _RollbackTool as rollback:
                state, result, is_error = rollback.state, rollback.result, True
            self._finish(turn, call, state, result, is_error, ResultSource.EXECUTED, atomic=False)

    def _finish(
        self,
        turn: Turn,
        call: ToolCall,
        state: str,
        result: Any,
        is_error: bool,
        source: str,
        *,
        atomic: bool = True,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """Commit a call's result; when it was the turn's last open call, close the turn too."""

        def write() -> None:
            events = _close_call(
                call, state, result, is_error=is_error, source=source, extra=extra, defer=self._rows
            )
            if all(c.is_closed for c in turn.calls):  # type: ignore[attr-defined]
                self._close_turn(turn, events)
                return
            following = self._next_to_start(turn) if atomic else None
            if following is not None:
                events += self._start(following)
            self._fenced(events, last=True)
            self._started = following

        if atomic:
            with self._tx():
                write()
        else:
            write()

    def _recover(self, turn: Turn, call: ToolCall, tool: Tool | None) -> None:
        """The executor of this in_flight call died: apply its side-effect class's policy."""
        side_effect = call.side_effect
        if (
            side_effect in (SideEffect.READ_ONLY, SideEffect.IDEMPOTENT_WRITE, SideEffect.ATOMIC)
            and tool is not None
        ):
            self._requeue_call(call, "rerun")
            return
        if tool is None:
            self._park_unknown(call, "The tool is no longer defined; its outcome is unknown.")
        if tool.reconcile is None:
            self._park_unknown(
                call,
                "The call was in flight when its worker died and the tool has no reconcile check.",
            )
        try:
            found = tool.invoke_reconcile(self._ctx(call), call.arguments)
        except Exception as exc:  # noqa: BLE001
            logger.exception("Reconcile check of %s failed run_id=%s", call.name, self.run_id)
            self._park_unknown(call, f"The reconcile check failed with {type(exc).__name__}.")
        if found.status == "done":
            try:
                result = stored_result(found.result)
            except InvalidContent as exc:
                self._park_unknown(call, f"The reconcile check's result cannot be recorded: {exc}")
            self._finish(
                turn,
                call,
                ToolCallState.SUCCEEDED,
                result,
                False,
                ResultSource.RECONCILED,
                extra={"policy": "reconciled"},
            )
        elif found.status == "not_done":
            # Evidence that it never happened: a new attempt, which (should it be
            # interrupted too) is checked again; the run's recovery cap bounds the loop.
            self._requeue_call(call, "reconciled_not_done")
        else:
            self._park_unknown(call, found.reason or "The reconcile check could not tell.")

    def _recover_only(self, turn: Turn | None) -> None:
        if turn is not None and turn.state == TurnState.AWAITING_TOOL:
            for call in turn.calls:  # type: ignore[attr-defined]
                if call.state == ToolCallState.IN_FLIGHT:
                    self._recover(turn, call, self._tool(call.name))
        with self._tx():
            self._fenced([], fields=services._release_fields())
            self.released = True
            services._enqueue(self.run_id)
        raise _Stop(Outcome.CONTINUED)

    def _requeue_call(self, call: ToolCall, policy: str) -> None:
        with self._tx():
            old = _set_state(call, ToolCallState.REQUESTED)
            _save(call, old)
            self._fenced(
                [
                    (
                        "tool_call_recovered",
                        {
                            "turn_index": call.turn_index,
                            "tool_call_id": call.tool_call_id,
                            "policy": policy,
                            "tool_call_state": call.state,
                        },
                    )
                ]
            )
        logger.info(
            "Recovered in-flight call %s (%s) run_id=%s", call.tool_call_id, policy, self.run_id
        )

    def _park_unknown(self, call: ToolCall, reason: str, *, already: bool = False) -> None:
        reason = storable_text(reason)
        with self._tx():
            events: list[Event] = []
            if not already:
                old = _set_state(call, ToolCallState.UNKNOWN)
                _save(call, old, unknown_reason=reason)
                events.append(
                    (
                        "tool_call_unknown",
                        {
                            "turn_index": call.turn_index,
                            "tool_call_id": call.tool_call_id,
                            "reason": reason,
                            "tool_call_state": call.state,
                        },
                    )
                )
            self._park(events)
            services._on_commit_signal(
                signals.reconciliation_needed, run=self.run_obj, tool_call=call, reason=reason
            )
        raise _Stop(Outcome.PARKED)

    def _park_approval(self, call: ToolCall, tool: Tool | None, *, already: bool = False) -> None:
        with self._tx():
            events: list[Event] = []
            token = ""
            if not already:
                old = _set_state(call, ToolCallState.AWAITING_APPROVAL)
                timeout = (
                    tool.approval_timeout.total_seconds()
                    if tool and tool.approval_timeout
                    else None
                ) or self.config.get("approval_timeout_seconds")
                token = services.approval_token(call)
                payload = {
                    "tool": call.name,
                    "description": tool.description if tool else "",
                    "arguments": call.arguments,
                    "side_effect": str(call.side_effect),
                    "run_id": str(self.run_id),
                    "turn_index": call.turn_index,
                    "token": token,
                }
                deadline = timezone.now() + timedelta(seconds=timeout) if timeout else None
                _save(call, old, approval_payload=payload, approval_deadline=deadline)
                events.append(
                    (
                        "approval_requested",
                        {
                            "turn_index": call.turn_index,
                            "tool_call_id": call.tool_call_id,
                            "payload": payload,
                            "token": token,
                            "deadline": deadline.isoformat() if deadline else None,
                            "tool_call_state": call.state,
                        },
                    )
                )
            self._park(events)
            services._on_commit_signal(
                signals.approval_requested, run=self.run_obj, tool_call=call, token=token
            )
        raise _Stop(Outcome.PARKED)

    def _park(self, events: list[Event]) -> None:
        old = _set_state(self.run_obj, RunState.AWAITING_APPROVAL)
        events.append(("run_parked", {"run_state": self.run_obj.state}))
        self._fenced(events, old_state=old, fields=services._release_fields())
        self.released = True

    # ----------------------------------------------------------------- endings

    def _fenced(self, events: list[Event], **kwargs: Any) -> None:
        """The run write under the lease. `last=True`: nothing follows it in this unit, so
        it may be sent alone (services.write_unit). A cancel request it sees is noted and
        fires the abort signal when the unit ends."""
        if fenced(self.run_obj, self.lease, events, rows=self._rows, **kwargs):
            self._cancel_seen = True

    def _close_turn(self, turn: Turn, events: list[Event], incr: dict | None = None) -> None:
        old = _set_state(turn, TurnState.COMPLETED)
        _save(turn, old, defer=self._rows, finished_at=timezone.now())
        events.append(("turn_completed", {"turn_index": turn.index, "turn_state": turn.state}))
        if self.abort.aborted:
            # Cancelled while the last tool ran: keep its result, let _interrupted end the run.
            self._fenced(events, incr=incr, last=True)
            return
        if turn.is_final:
            self._complete("max_turns", events, incr=incr)
        self._continue(events, incr=incr)

    def _continue(self, events: list[Event], incr: dict | None = None) -> None:
        """The turn is closed: release the lease and enqueue the next turn on commit."""
        run = self.run_obj
        old = None
        if run.state != RunState.RUNNING:
            old = _set_state(run, RunState.RUNNING)
            events.append(("run_continued", {"run_state": run.state}))
        self._fenced(
            events,
            old_state=old,
            incr=incr,
            fields={**services._release_fields(), "recovery_attempts": 0},
            last=True,
        )
        self.released = True
        services._enqueue(run.pk)
        raise _Stop(Outcome.CONTINUED)

    def _complete(self, stop_reason: str, events: list[Event], incr: dict | None = None) -> None:
        run = self.run_obj
        final = next((t for t in reversed(self.turns) if t.content), None)
        output = {
            "text": text_of(final.content if final else None),
            "content": final.content if final else [],
        }
        old = _set_state(run, RunState.COMPLETED)
        totals = {k: getattr(run, k) + (incr or {}).get(k, 0) for k in run.usage()}
        events.append(
            (
                "run_completed",
                {
                    "run_state": run.state,
                    "stop_reason": stop_reason,
                    "output": output,
                    "usage": totals,
                },
            )
        )
        self._fenced(
            events,
            old_state=old,
            incr=incr,
            fields={
                **services._release_fields(),
                "output": output,
                "stop_reason": stop_reason,
                "finished_at": timezone.now(),
            },
            last=True,
        )
        self.released = True
        services._on_commit_signal(signals.run_finished, run=run, state=run.state)
        logger.info("Run completed run_id=%s stop_reason=%s", run.pk, stop_reason)
        raise _Stop(Outcome.FINISHED)

    def _fail(
        self,
        code: str,
        message: str,
        phase: str,
        events: list[Event],
        *,
        turn: Turn | None = None,
        incr: dict | None = None,
    ) -> None:
        if incr:
            self._fenced([], incr=incr)
        services.run_failed(
            self.run_obj,
            self.lease,
            code=code,
            message=message,
            phase=phase,
            events=events,
            turn=turn or self._open_turn(),
        )
        self.released = True
        raise _Stop(Outcome.FINISHED)

    def _open_turn(self) -> Turn | None:
        turn = self.turns[-1] if self.turns else None
        if turn is not None and turn.state in (TurnState.RUNNING, TurnState.AWAITING_TOOL):
            return turn
        return None

    def _close(self, target: str, reason: str, events: list[Event]) -> None:
        services.close_run(
            self.run_obj,
            self.lease,
            target,
            reason,
            events,
            not_started=frozenset(self._not_started),
        )
        self.released = True
        raise _Stop(Outcome.FINISHED)

    def _interrupted(self) -> None:
        """The abort signal fired: a cancel request (close cleanly) or a lost lease (leave)."""
        self._interrupting = True
        with self._tx(lazy=False):
            run = Run.objects.select_for_update().get(pk=self.run_id)
            if run.lease_epoch != self.lease.epoch or run.lease_owner != self.lease.owner:
                raise LeaseLost(f"Run {self.run_id}: lease lost")
            self.run_obj = run
            if run.cancel_requested_at is not None:
                self._close(RunState.CANCELLED, run.cancel_reason or "cancelled", [])
            if run.deadline is not None and run.deadline <= timezone.now():
                self._close(RunState.TIMED_OUT, "deadline passed", [])
        raise LeaseLost(f"Run {self.run_id}: aborted ({self.abort.reason})")


def _complete(response: ModelResponse) -> ModelResponse:
    """Only a complete response is recorded or executed: one without a stop reason was cut
    short (whatever client produced it), so it is retried like a dropped connection."""
    if not response.stop_reason:
        raise ModelError(
            "The model's response has no stop reason: it is incomplete.", retryable=True
        )
    return response


def _bad_result(call: ToolCall, exc: InvalidContent) -> str:
    logger.warning(
        "Tool %s returned an invalid result run_id=%s tool_call_id=%s: %s",
        call.name,
        call.run_id,
        call.tool_call_id,
        exc,
    )
    # It ran: a result that cannot be recorded must not look like a crash (that would run
    # it again), so the model is told, and the call closes.
    return (
        f"Tool {call.name} ran, but its result cannot be recorded or sent (a bug in the tool, "
        f"not in your call): {exc}"
    )


class _RollbackTool(Exception):
    def __init__(self, state: str, result: Any) -> None:
        self.state, self.result = state, result
