WITH r AS (UPDATE "agentrun_run" SET "started_at" = %s, "updated_at" = %s, "state" = %s, "last_seq" = "last_seq" + %s
WHERE "id" = %s AND "state" = %s AND "lease_epoch" = %s AND "lease_owner" = %s
RETURNING "last_seq", "cancel_requested_at"),
e AS (INSERT INTO "agentrun_runevent" ("run_id", "seq", "type", "payload", "created_at")
      SELECT %s, r."last_seq" - %s + v.i, v.t, v.p, %s FROM r, (VALUES (%s, %s, %s::jsonb)) AS v(i, t, p))
SELECT r."last_seq", r."cancel_requested_at" FROM r
