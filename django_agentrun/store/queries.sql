-- Every statement the engine and the reaper send by hand on Postgres, complete and by
-- name (store/sql.py loads them once; procrastinate's habit). Values are named
-- parameters, %(name)s, never spliced in. Times are the database's (statement_timestamp()):
-- leases are set and judged by its clock, not by each app server's. On other databases
-- the store does the same through the ORM (store/leases.py, store/writes.py).
-- tests/postgres/test_golden_sql.py sends each write shape of a turn and keeps what it
-- sent, so a change here shows in review; tests/postgres/test_write.py checks that every
-- column of the tables is named below or declared unchanging.

-- name: claim_released
-- Take a released lease (the usual case): no recovery is counted. A run of a conversation
-- is not taken while an earlier run of it is active (queued, running, awaiting_tool or
-- awaiting_approval): a follow-up starts once they have all ended, and the transition
-- that ends one wakes it after its commit (transitions._ended wakes what
-- store.leases.following_runs finds). Outside a conversation the subquery finds nothing
-- (conversation_id is NULL); it reads the unique index agentrun_run_conversation_position.
UPDATE "agentrun_run"
SET "lease_owner" = %(owner)s,
    "lease_expires_at" = statement_timestamp() + %(lease_seconds)s * interval '1 second',
    "lease_epoch" = "lease_epoch" + 1,
    "updated_at" = statement_timestamp()
WHERE "id" = %(run_id)s
  AND "state" IN ('queued', 'running', 'awaiting_tool')
  AND "lease_owner" = ''
  AND NOT EXISTS (
    SELECT 1 FROM "agentrun_run" AS e
    WHERE e."conversation_id" = "agentrun_run"."conversation_id"
      AND e."conversation_position" < "agentrun_run"."conversation_position"
      AND e."state" IN ('queued', 'running', 'awaiting_tool', 'awaiting_approval')
  )
RETURNING *

-- name: claim_takeover
-- Take the lease from a holder that never released it: expired by the database's clock,
-- or the holder named in %(dead_holder)s (known dead; NULL for none). Counts a recovery.
UPDATE "agentrun_run"
SET "lease_owner" = %(owner)s,
    "lease_expires_at" = statement_timestamp() + %(lease_seconds)s * interval '1 second',
    "lease_epoch" = "lease_epoch" + 1,
    "recovery_attempts" = "recovery_attempts" + 1,
    "updated_at" = statement_timestamp()
WHERE "id" = %(run_id)s
  AND "state" IN ('queued', 'running', 'awaiting_tool')
  AND "lease_owner" <> ''
  AND ("lease_expires_at" < statement_timestamp() OR "lease_owner" = %(dead_holder)s)
RETURNING *

-- name: select_turns
-- A turn's content from the event that holds it (content_seq; models/recorded.py
-- EventValue, the same subquery): the event row holding that seq, read backwards through
-- the unique (run, seq) index. Rows written before migration 0020 hold it inline.
SELECT t.*, (
  SELECT e."events" -> (t."content_seq" - e."seq") -> 1 -> 'content'
  FROM "agentrun_runeventrow" AS e
  WHERE e."run_id" = t."run_id" AND e."seq" <= t."content_seq"
  ORDER BY e."seq" DESC LIMIT 1
) AS "recorded_content"
FROM "agentrun_turn" AS t WHERE t."run_id" = %(run_id)s ORDER BY t."index"

-- name: select_tool_calls
-- A call's result from the event that recorded it (result_seq), as select_turns reads a
-- turn's content.
SELECT c.*, (
  SELECT e."events" -> (c."result_seq" - e."seq") -> 1 -> 'result'
  FROM "agentrun_runeventrow" AS e
  WHERE e."run_id" = c."run_id" AND e."seq" <= c."result_seq"
  ORDER BY e."seq" DESC LIMIT 1
) AS "recorded_result"
FROM "agentrun_toolcall" AS c WHERE c."run_id" = %(run_id)s ORDER BY c."turn_index", c."position"

-- name: select_earlier_runs
-- A conversation's runs before %(position)s that its history holds (not rolled back), in
-- order: what each contributes is its input, its context and its turns (below). The
-- claim of a follow-up reads them once per task; nothing is copied into the follow-up.
SELECT "id", "conversation_position", "input", "context", "state", "last_seq"
FROM "agentrun_run"
WHERE "conversation_id" = %(conversation_id)s AND "conversation_position" < %(position)s
  AND NOT "rolled_back"
ORDER BY "conversation_position"

-- name: select_earlier_turns
SELECT t.*, (
  SELECT e."events" -> (t."content_seq" - e."seq") -> 1 -> 'content'
  FROM "agentrun_runeventrow" AS e
  WHERE e."run_id" = t."run_id" AND e."seq" <= t."content_seq"
  ORDER BY e."seq" DESC LIMIT 1
) AS "recorded_content"
FROM "agentrun_turn" AS t JOIN "agentrun_run" AS r ON r."id" = t."run_id"
WHERE r."conversation_id" = %(conversation_id)s AND r."conversation_position" < %(position)s
  AND NOT r."rolled_back"
ORDER BY r."conversation_position", t."index"

-- name: select_earlier_tool_calls
SELECT c.*, (
  SELECT e."events" -> (c."result_seq" - e."seq") -> 1 -> 'result'
  FROM "agentrun_runeventrow" AS e
  WHERE e."run_id" = c."run_id" AND e."seq" <= c."result_seq"
  ORDER BY e."seq" DESC LIMIT 1
) AS "recorded_result"
FROM "agentrun_toolcall" AS c JOIN "agentrun_run" AS r ON r."id" = c."run_id"
WHERE r."conversation_id" = %(conversation_id)s AND r."conversation_position" < %(position)s
  AND NOT r."rolled_back"
ORDER BY r."conversation_position", c."turn_index", c."position"

-- name: renew_lease
UPDATE "agentrun_run"
SET "lease_expires_at" = statement_timestamp() + %(lease_seconds)s * interval '1 second'
WHERE "id" = %(run_id)s AND "lease_epoch" = %(epoch)s AND "lease_owner" = %(owner)s
RETURNING "cancel_requested_at"

-- name: poll_cancel
SELECT "lease_epoch", "lease_owner", "cancel_requested_at" FROM "agentrun_run"
WHERE "id" = %(run_id)s

-- name: release_lease
-- Give the lease back; it keeps the time: a run nobody claims since then lost its wake-up.
UPDATE "agentrun_run" SET "lease_owner" = '', "lease_expires_at" = statement_timestamp()
WHERE "id" = %(run_id)s AND "lease_epoch" = %(epoch)s AND "lease_owner" = %(owner)s

-- name: expire_lease
-- Let the lease run out now, keeping its owner: the next claim is a take-over and counts
-- a recovery (a step that stopped because it could not renew its lease). The epoch moves
-- on: a renewal of this holder's still on its way (its heartbeat's, sent before it
-- stopped) finds nothing to renew, instead of making the lease live again for a whole
-- lease while the wake-up sent for the take-over finds it held.
UPDATE "agentrun_run"
SET "lease_expires_at" = statement_timestamp(), "lease_epoch" = "lease_epoch" + 1
WHERE "id" = %(run_id)s AND "lease_epoch" = %(epoch)s AND "lease_owner" = %(owner)s

-- name: take_lease
-- The reaper, holding the row locked: fence out any previous holder.
UPDATE "agentrun_run"
SET "lease_owner" = %(owner)s,
    "lease_expires_at" = statement_timestamp() + %(lease_seconds)s * interval '1 second',
    "lease_epoch" = "lease_epoch" + 1
WHERE "id" = %(run_id)s
RETURNING "lease_epoch", "lease_expires_at"

-- name: lock_share
-- A cap's lock (AGENTRUN_MAX_RUNS_PER_KEY, an Agent's max_concurrent_runs; store/caps.py),
-- the transaction's own (released at its end: nothing is left on the server connection):
-- two claims under one cap count one after the other, each seeing the other's lease.
SELECT pg_advisory_xact_lock(hashtextextended(%(share)s, 0))

-- name: worked_by_agent
-- The runs of an agent worked now (a live lease), but the one being claimed: read through
-- agentrun_run_ph_leased_idx (a lease is held only by a run running or awaiting a tool:
-- the phase 'leased').
SELECT count(*) FROM "agentrun_run"
WHERE "phase" = 'leased' AND "agent" = %(value)s
  AND "lease_owner" <> '' AND "lease_expires_at" > statement_timestamp()
  AND "id" <> %(run_id)s

-- name: worked_by_share_key
-- The same for a fair-share key (the run's "share_key", named when it was created).
SELECT count(*) FROM "agentrun_run"
WHERE "phase" = 'leased' AND "share_key" = %(value)s
  AND "lease_owner" <> '' AND "lease_expires_at" > statement_timestamp()
  AND "id" <> %(run_id)s

-- name: database_now
SELECT statement_timestamp()

-- name: write
-- One commit, as one statement: the call of the function agentrun_write (`write_function`
-- below, installed by a migration). Sent alone in autocommit it is its own transaction,
-- all or nothing; nothing of it stays on the server connection afterwards, so it works
-- behind any connection pooler (PgBouncer in transaction mode included). Postgres keeps
-- the plans of the function's statement per server connection (PL/pgSQL's plan cache):
-- the long statement is parsed and planned once per connection, not for every commit.
SELECT * FROM agentrun_write(
  p_run_id => %(run_id)s::uuid,
  p_expected_state => %(expected_state)s::text,
  p_epoch => %(epoch)s::bigint,
  p_owner => %(owner)s::text,
  p_lease => %(lease)s::text,
  p_lease_seconds => %(lease_seconds)s::float8,
  p_run_changes => %(run_changes)s::jsonb,
  p_input_tokens => %(input_tokens)s::bigint,
  p_output_tokens => %(output_tokens)s::bigint,
  p_cache_creation_input_tokens => %(cache_creation_input_tokens)s::bigint,
  p_cache_read_input_tokens => %(cache_read_input_tokens)s::bigint,
  p_cost_usd => %(cost_usd)s::numeric,
  p_turn_count => %(turn_count)s::integer,
  p_turns_added => %(turns_added)s::jsonb,
  p_turns_changed => %(turns_changed)s::jsonb,
  p_turns_changed_count => %(turns_changed_count)s::integer,
  p_calls_added => %(calls_added)s::jsonb,
  p_calls_changed => %(calls_changed)s::jsonb,
  p_calls_changed_count => %(calls_changed_count)s::integer,
  p_events => %(events)s::jsonb,
  p_event_count => %(event_count)s::integer
)

-- name: write_function
-- The function `write` calls (migration 0013_eventrows_commit_rows installs it;
-- tests/postgres/test_write.py checks that the database has this text): the run's
-- compare-and-set UPDATE (r), fenced by its lease, with the turn and tool-call rows the
-- commit adds or changes and its events, as one statement.
--
-- Rows to change come as JSON lists of {"id", "expected" (the state the row was read in),
-- "changes" (column -> new value)}; a column absent from "changes" keeps its value (and a
-- large value stays where TOAST put it). Rows to add come as JSON lists of whole rows. The
-- run's new values come in p_run_changes the same way; p_lease says what happens to the
-- lease's expiry: 'keep', 'now' (released, or run out) or 'renew'. The commit's events
-- come in p_events as a JSON array of [type, payload] pairs and are stored as they come, in
-- one agentrun_runeventrow row whose seqs run up to the run's new last_seq (RunEventRow;
-- the view agentrun_event shows them one per seq).
--
-- A value an event records is not copied into its row (issue #38; models/recorded.py): a
-- turn's "content_seq" (a call's "result_seq") comes as the place of its model_response
-- event (of the event that recorded the result) in p_events (1 for the first) and is
-- stored as the seq that event takes, the run's last_seq (read in run_locked, the row
-- locked) plus that place; the row's "content" ("result") stays NULL.
--
-- The rows to change are read through LIMIT <their count> (the count the run's UPDATE
-- checks anyway): the planner cannot see into a JSON list and takes it for 100 rows, which
-- makes a hash join over a sequential scan of the whole turn or tool-call table look
-- cheaper than a few primary-key lookups; with the LIMIT it plans the lookups (also in the
-- generic plan PL/pgSQL keeps after a few calls).
--
-- Refusals: r matches only if the run is still in p_expected_state (when given), still
-- held under p_epoch by p_owner (when given), and every row change matched its row.
-- With no r the events' row starts at seq 1, where the run's first row already starts: the
-- statement fails as a whole on the unique constraint agentrun_runevent_seq (FENCE_CONSTRAINT),
-- which store/writes.py turns into LeaseLost or ConcurrentUpdate.
--
-- Lock order (store/locks.py, docs/explanation/durability.md): the run's row first, then its turns and
-- tool calls, as every service and the reaper take them. run_locked takes the run's row
-- (FOR NO KEY UPDATE: the run's own UPDATE below takes the same lock) and the two UPDATEs
-- of turns and tool calls join it, so no turn or call row is locked before the run's.
-- Without it a call's row was locked first and the run's last: a decision holding the run
-- and waiting for the call deadlocked with it. (Carried over into the function as is.)
--
-- `#variable_conflict use_column`: a name that is both a column and one of the result's
-- columns (last_seq...) means the column; the parameters' p_ prefix is no column's.
CREATE OR REPLACE FUNCTION agentrun_write(
  p_run_id uuid,
  p_expected_state text,
  p_epoch bigint,
  p_owner text,
  p_lease text,
  p_lease_seconds double precision,
  p_run_changes jsonb,
  p_input_tokens bigint,
  p_output_tokens bigint,
  p_cache_creation_input_tokens bigint,
  p_cache_read_input_tokens bigint,
  p_cost_usd numeric,
  p_turn_count integer,
  p_turns_added jsonb,
  p_turns_changed jsonb,
  p_turns_changed_count integer,
  p_calls_added jsonb,
  p_calls_changed jsonb,
  p_calls_changed_count integer,
  p_events jsonb,
  p_event_count integer
) RETURNS TABLE (
  last_seq integer,
  cancel_requested_at timestamptz,
  lease_expires_at timestamptz,
  turn_ids jsonb,
  call_ids jsonb
) LANGUAGE plpgsql AS $agentrun_write$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH
run_locked AS MATERIALIZED (
  SELECT "id", "last_seq" AS "seq_before" FROM "agentrun_run" WHERE "id" = p_run_id
  FOR NO KEY UPDATE
),
turns_changed AS (
  UPDATE "agentrun_turn" AS t SET
    "state" = CASE WHEN v.changes ? 'state' THEN p."state" ELSE t."state" END,
    "content" = CASE WHEN v.changes ? 'content' THEN p."content" ELSE t."content" END,
    "content_seq" = CASE WHEN v.changes ? 'content_seq' THEN run_locked."seq_before" + p."content_seq" ELSE t."content_seq" END,
    "message_id" = CASE WHEN v.changes ? 'message_id' THEN p."message_id" ELSE t."message_id" END,
    "request_id" = CASE WHEN v.changes ? 'request_id' THEN p."request_id" ELSE t."request_id" END,
    "model" = CASE WHEN v.changes ? 'model' THEN p."model" ELSE t."model" END,
    "stop_reason" = CASE WHEN v.changes ? 'stop_reason' THEN p."stop_reason" ELSE t."stop_reason" END,
    "model_attempts" = CASE WHEN v.changes ? 'model_attempts' THEN p."model_attempts" ELSE t."model_attempts" END,
    "usage_details" = CASE WHEN v.changes ? 'usage_details' THEN p."usage_details" ELSE t."usage_details" END,
    "prefix" = CASE WHEN v.changes ? 'prefix' THEN p."prefix" ELSE t."prefix" END,
    "input_tokens" = CASE WHEN v.changes ? 'input_tokens' THEN p."input_tokens" ELSE t."input_tokens" END,
    "output_tokens" = CASE WHEN v.changes ? 'output_tokens' THEN p."output_tokens" ELSE t."output_tokens" END,
    "cache_creation_input_tokens" = CASE WHEN v.changes ? 'cache_creation_input_tokens' THEN p."cache_creation_input_tokens" ELSE t."cache_creation_input_tokens" END,
    "cache_read_input_tokens" = CASE WHEN v.changes ? 'cache_read_input_tokens' THEN p."cache_read_input_tokens" ELSE t."cache_read_input_tokens" END,
    "finished_at" = CASE WHEN v.changes ? 'finished_at' THEN p."finished_at" ELSE t."finished_at" END
  FROM run_locked,
       (SELECT * FROM jsonb_to_recordset(p_turns_changed)
          AS x("id" bigint, "expected" text, "changes" jsonb)
        LIMIT p_turns_changed_count) AS v,
       LATERAL jsonb_populate_record(NULL::"agentrun_turn", v.changes) AS p
  WHERE t."id" = v."id" AND (v."expected" IS NULL OR t."state" = v."expected")
  RETURNING t."id"
),
turns_added AS (
  INSERT INTO "agentrun_turn" (
    "run_id", "index", "state", "is_final", "content", "content_seq", "message_id", "request_id",
    "model", "stop_reason", "model_attempts", "usage_details", "prefix", "input_tokens",
    "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "started_at",
    "finished_at"
  )
  SELECT p."run_id", p."index", p."state", p."is_final", p."content",
         (SELECT l."seq_before" FROM run_locked AS l) + p."content_seq", p."message_id",
         p."request_id", p."model", p."stop_reason", p."model_attempts",
         COALESCE(p."usage_details", '{}'::jsonb), COALESCE(p."prefix", ''), p."input_tokens",
         p."output_tokens", p."cache_creation_input_tokens", p."cache_read_input_tokens",
         p."started_at", p."finished_at"
  FROM jsonb_array_elements(p_turns_added) AS v(row),
       LATERAL jsonb_populate_record(NULL::"agentrun_turn", v.row) AS p
  RETURNING "id", "index"
),
calls_changed AS (
  UPDATE "agentrun_toolcall" AS c SET
    "state" = CASE WHEN v.changes ? 'state' THEN p."state" ELSE c."state" END,
    "attempt" = CASE WHEN v.changes ? 'attempt' THEN p."attempt" ELSE c."attempt" END,
    "started_at" = CASE WHEN v.changes ? 'started_at' THEN p."started_at" ELSE c."started_at" END,
    "heartbeat_at" = CASE WHEN v.changes ? 'heartbeat_at' THEN p."heartbeat_at" ELSE c."heartbeat_at" END,
    "finished_at" = CASE WHEN v.changes ? 'finished_at' THEN p."finished_at" ELSE c."finished_at" END,
    "result" = CASE WHEN v.changes ? 'result' THEN p."result" ELSE c."result" END,
    "result_seq" = CASE WHEN v.changes ? 'result_seq' THEN run_locked."seq_before" + p."result_seq" ELSE c."result_seq" END,
    "result_format" = CASE WHEN v.changes ? 'result_format' THEN p."result_format" ELSE c."result_format" END,
    "is_error" = CASE WHEN v.changes ? 'is_error' THEN p."is_error" ELSE c."is_error" END,
    "result_source" = CASE WHEN v.changes ? 'result_source' THEN p."result_source" ELSE c."result_source" END,
    "unknown_reason" = CASE WHEN v.changes ? 'unknown_reason' THEN p."unknown_reason" ELSE c."unknown_reason" END,
    "approved" = CASE WHEN v.changes ? 'approved' THEN p."approved" ELSE c."approved" END,
    "approval_payload" = CASE WHEN v.changes ? 'approval_payload' THEN p."approval_payload" ELSE c."approval_payload" END,
    "approval_deadline" = CASE WHEN v.changes ? 'approval_deadline' THEN p."approval_deadline" ELSE c."approval_deadline" END,
    "decided_by_id" = CASE WHEN v.changes ? 'decided_by_id' THEN p."decided_by_id" ELSE c."decided_by_id" END,
    "decided_at" = CASE WHEN v.changes ? 'decided_at' THEN p."decided_at" ELSE c."decided_at" END,
    "decision_note" = CASE WHEN v.changes ? 'decision_note' THEN p."decision_note" ELSE c."decision_note" END,
    "arguments" = CASE WHEN v.changes ? 'arguments' THEN p."arguments" ELSE c."arguments" END,
    "arguments_hash" = CASE WHEN v.changes ? 'arguments_hash' THEN p."arguments_hash" ELSE c."arguments_hash" END,
    "original_arguments" = CASE WHEN v.changes ? 'original_arguments' THEN p."original_arguments" ELSE c."original_arguments" END
  FROM run_locked,
       (SELECT * FROM jsonb_to_recordset(p_calls_changed)
          AS x("id" bigint, "expected" text, "changes" jsonb)
        LIMIT p_calls_changed_count) AS v,
       LATERAL jsonb_populate_record(NULL::"agentrun_toolcall", v.changes) AS p
  WHERE c."id" = v."id" AND (v."expected" IS NULL OR c."state" = v."expected")
  RETURNING c."id"
),
calls_added AS (
  INSERT INTO "agentrun_toolcall" (
    "run_id", "turn_id", "turn_index", "tool_call_id", "position", "name", "arguments",
    "arguments_hash", "side_effect", "idempotency_key", "state", "attempt", "started_at",
    "heartbeat_at", "finished_at", "result", "result_seq", "result_format", "is_error",
    "result_source", "unknown_reason", "approved", "approval_payload", "approval_deadline",
    "decided_by_id", "decided_at", "decision_note", "original_arguments", "created_at"
  )
  SELECT p."run_id",
         -- A call of a turn added by this same statement takes that turn's new id.
         COALESCE(p."turn_id", (SELECT a."id" FROM turns_added a WHERE a."index" = p."turn_index")),
         p."turn_index", p."tool_call_id", p."position", p."name", p."arguments",
         p."arguments_hash", p."side_effect", p."idempotency_key", p."state", p."attempt",
         p."started_at", p."heartbeat_at", p."finished_at", p."result",
         (SELECT l."seq_before" FROM run_locked AS l) + p."result_seq", p."result_format",
         p."is_error", p."result_source", p."unknown_reason", p."approved",
         p."approval_payload", p."approval_deadline", p."decided_by_id", p."decided_at",
         p."decision_note", p."original_arguments", p."created_at"
  FROM jsonb_array_elements(p_calls_added) AS v(row),
       LATERAL jsonb_populate_record(NULL::"agentrun_toolcall", v.row) AS p
  RETURNING "id", "turn_index", "position"
),
r AS (
  UPDATE "agentrun_run" AS r SET
    "state" = CASE WHEN s.changes ? 'state' THEN p."state" ELSE r."state" END,
    "lease_owner" = CASE WHEN s.changes ? 'lease_owner' THEN p."lease_owner" ELSE r."lease_owner" END,
    "lease_expires_at" = CASE p_lease
        WHEN 'now' THEN statement_timestamp()
        WHEN 'renew' THEN statement_timestamp() + p_lease_seconds * interval '1 second'
        ELSE r."lease_expires_at" END,
    "recovery_attempts" = CASE WHEN s.changes ? 'recovery_attempts' THEN p."recovery_attempts" ELSE r."recovery_attempts" END,
    "output" = CASE WHEN s.changes ? 'output' THEN p."output" ELSE r."output" END,
    "parsed_output" = CASE WHEN s.changes ? 'parsed_output' THEN p."parsed_output" ELSE r."parsed_output" END,
    "stop_reason" = CASE WHEN s.changes ? 'stop_reason' THEN p."stop_reason" ELSE r."stop_reason" END,
    "error_code" = CASE WHEN s.changes ? 'error_code' THEN p."error_code" ELSE r."error_code" END,
    "error_message" = CASE WHEN s.changes ? 'error_message' THEN p."error_message" ELSE r."error_message" END,
    "failure_phase" = CASE WHEN s.changes ? 'failure_phase' THEN p."failure_phase" ELSE r."failure_phase" END,
    "last_checkpoint" = CASE WHEN s.changes ? 'last_checkpoint' THEN p."last_checkpoint" ELSE r."last_checkpoint" END,
    "cancel_requested_at" = CASE WHEN s.changes ? 'cancel_requested_at' THEN p."cancel_requested_at" ELSE r."cancel_requested_at" END,
    "cancel_reason" = CASE WHEN s.changes ? 'cancel_reason' THEN p."cancel_reason" ELSE r."cancel_reason" END,
    "cancel_requested_by_id" = CASE WHEN s.changes ? 'cancel_requested_by_id' THEN p."cancel_requested_by_id" ELSE r."cancel_requested_by_id" END,
    "deadline" = CASE WHEN s.changes ? 'deadline' THEN p."deadline" ELSE r."deadline" END,
    "queued_at" = CASE WHEN s.changes ? 'queued_at' THEN p."queued_at" ELSE r."queued_at" END,
    "started_at" = CASE WHEN s.changes ? 'started_at' THEN p."started_at" ELSE r."started_at" END,
    "finished_at" = CASE WHEN s.changes ? 'finished_at' THEN p."finished_at" ELSE r."finished_at" END,
    "rolled_back" = CASE WHEN s.changes ? 'rolled_back' THEN p."rolled_back" ELSE r."rolled_back" END,
    "input_tokens" = r."input_tokens" + p_input_tokens,
    "output_tokens" = r."output_tokens" + p_output_tokens,
    "cache_creation_input_tokens" = r."cache_creation_input_tokens" + p_cache_creation_input_tokens,
    "cache_read_input_tokens" = r."cache_read_input_tokens" + p_cache_read_input_tokens,
    "cost_usd" = r."cost_usd" + p_cost_usd,
    "turn_count" = r."turn_count" + p_turn_count,
    "last_seq" = r."last_seq" + p_event_count,
    "updated_at" = statement_timestamp()
  FROM (SELECT p_run_changes AS changes) AS s,
       LATERAL jsonb_populate_record(NULL::"agentrun_run", s.changes) AS p
  WHERE r."id" = p_run_id
    AND (p_expected_state IS NULL OR r."state" = p_expected_state)
    AND (p_epoch IS NULL
         OR (r."lease_epoch" = p_epoch AND r."lease_owner" = p_owner))
    AND (SELECT count(*) FROM turns_changed) = p_turns_changed_count
    AND (SELECT count(*) FROM calls_changed) = p_calls_changed_count
    -- The rows added before this UPDATE: they read run_locked, which finds no row once
    -- this statement has updated it (a row the statement changed is not locked again).
    AND (SELECT count(*) FROM turns_added) >= 0
    AND (SELECT count(*) FROM calls_added) >= 0
  RETURNING r."last_seq", r."cancel_requested_at", r."lease_expires_at"
),
events AS (
  INSERT INTO "agentrun_runeventrow" ("run_id", "seq", "seq_to", "events", "created_at")
  SELECT p_run_id,
         COALESCE((SELECT r."last_seq" FROM r) - p_event_count + 1, 1),
         COALESCE((SELECT r."last_seq" FROM r), 1),
         p_events, statement_timestamp()
  WHERE p_event_count > 0
)
SELECT r."last_seq", r."cancel_requested_at", r."lease_expires_at",
       (SELECT COALESCE(jsonb_agg(jsonb_build_array(a."index", a."id")), '[]') FROM turns_added a),
       (SELECT COALESCE(jsonb_agg(jsonb_build_array(a."turn_index", a."position", a."id")), '[]')
          FROM calls_added a)
FROM r;
END
$agentrun_write$
