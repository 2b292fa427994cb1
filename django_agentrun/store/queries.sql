-- Every statement the engine and the reaper write by hand, by name (store/sql.py loads
-- them once). `{slot}`s are filled only with identifiers, column lists and placeholder
-- lists built from the models; values are always parameters (%s).
-- tests/postgres/test_golden_sql.py renders each write shape of a turn, so a change here shows in review.

-- name: claim_released
-- Take a released lease (the usual case): no recovery is counted.
UPDATE "agentrun_run"
SET "lease_owner" = %s, "lease_expires_at" = {expires}, "updated_at" = %s,
    "lease_epoch" = "lease_epoch" + 1
WHERE "id" = %s AND "state" IN (%s, %s, %s) AND "lease_owner" = ''
RETURNING {run_columns}

-- name: claim_takeover
-- Take the lease from a holder that never released it: expired by the database's clock,
-- or the holder named (known dead). Counts a recovery.
UPDATE "agentrun_run"
SET "lease_owner" = %s, "lease_expires_at" = {expires}, "updated_at" = %s,
    "lease_epoch" = "lease_epoch" + 1, "recovery_attempts" = "recovery_attempts" + 1
WHERE "id" = %s AND "state" IN (%s, %s, %s) AND "lease_owner" <> ''
  AND ("lease_expires_at" < {now}{or_steal})
RETURNING {run_columns}

-- name: steal
 OR "lease_owner" = %s

-- name: select_turns
SELECT {turn_columns} FROM "agentrun_turn" WHERE "run_id" = %s ORDER BY "index"

-- name: select_tool_calls
SELECT {call_columns} FROM "agentrun_toolcall" WHERE "run_id" = %s
ORDER BY "turn_index", "position"

-- name: renew_lease
UPDATE "agentrun_run" SET "lease_expires_at" = {expires}
WHERE "id" = %s AND "lease_epoch" = %s AND "lease_owner" = %s
RETURNING "cancel_requested_at"

-- name: poll_cancel
SELECT "lease_epoch", "lease_owner", "cancel_requested_at" FROM "agentrun_run" WHERE "id" = %s

-- name: release_lease
UPDATE "agentrun_run" SET "lease_owner" = '', "lease_expires_at" = {now}
WHERE "id" = %s AND "lease_epoch" = %s AND "lease_owner" = %s

-- name: take_lease
-- The reaper, holding the row locked: fence out any previous holder.
UPDATE "agentrun_run" SET "lease_owner" = %s, "lease_expires_at" = {expires}, "lease_epoch" = %s
WHERE "id" = %s
RETURNING "lease_expires_at"

-- name: database_now
SELECT statement_timestamp()

-- name: now_postgres
-- The database's clock: leases are set and judged by it, not by each app server's.
statement_timestamp()

-- name: later_postgres
(statement_timestamp() + %s * interval '1 second')

-- name: utc_column
-- Timestamps read as UTC `timestamp`: psycopg parses that in C (Django's timestamptz
-- loader is pure Python); rows.instances puts the tzinfo back.
({column} AT TIME ZONE 'UTC')

-- name: run_update
-- The compare-and-set write of a run row. {conditions}: the expected state, the lease
-- (epoch and owner), and for a lone write every row update of the statement (see
-- composed_write). last_seq grows by the number of events: their seqs, gap-free.
UPDATE "agentrun_run" SET {assignments}, "last_seq" = "last_seq" + %s
WHERE "id" = %s{conditions}
RETURNING "last_seq", "cancel_requested_at"

-- name: expected_state
 AND "state" = %s

-- name: fence
 AND "lease_epoch" = %s AND "lease_owner" = %s

-- name: gate
 AND EXISTS (SELECT 1 FROM c{i})

-- name: row_update
-- A compare-and-set update of one turn or tool call (the state it was read in).
UPDATE {table} SET {assignments} WHERE "id" = %s{expected_state}

-- name: rows_insert
INSERT INTO {table} ({columns}) VALUES {rows}

-- name: events_insert
-- Events after their run write (SQLite, or when the run write is sent on its own).
INSERT INTO "agentrun_runevent" ("run_id", "seq", "type", "payload", "created_at") VALUES {rows}

-- name: composed_write
-- Postgres: a step's deferred row inserts and updates (c0, c1, ...), its run write (r)
-- and its events (e) as one statement. The events take their seqs from r. Each row
-- update's count and each insert's new ids come back to be checked. Alone (autocommit),
-- r matches only if every row update matched (gates), and with no r the events' seq is
-- 1, which the run already has: the statement fails as a whole on the unique constraint
-- agentrun_runevent_seq (FENCE_CONSTRAINT), which store.runs turns into the refusal.
WITH {ctes}r AS ({run_update}),
e AS (INSERT INTO "agentrun_runevent" ("run_id", "seq", "type", "payload", "created_at")
      SELECT %s, {seq}, v.t, v.p, %s FROM {source}(VALUES {rows}) AS v(i, t, p))
SELECT r."last_seq", r."cancel_requested_at"{results} FROM r

-- name: seq_alone
COALESCE((SELECT "last_seq" FROM r) - %s + v.i, 1)

-- name: seq_in_transaction
r."last_seq" - %s + v.i
