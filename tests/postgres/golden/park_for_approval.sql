WITH c0 AS (UPDATE "agentrun_toolcall" SET "approval_payload" = %s, "approval_deadline" = %s, "state" = %s WHERE "id" = %s AND "state" = %s RETURNING 1), r AS (UPDATE "agentrun_run" SET "lease_owner" = %s, "lease_expires_at" = statement_timestamp(), "updated_at" = %s, "state" = %s, "last_seq" = "last_seq" + %s
WHERE "id" = %s AND "state" = %s AND "lease_epoch" = %s AND "lease_owner" = %s AND EXISTS (SELECT 1 FROM c0)
RETURNING "last_seq", "cancel_requested_at"),
e AS (INSERT INTO "agentrun_runevent" ("run_id", "seq", "type", "payload", "created_at")
      SELECT %s, COALESCE((SELECT "last_seq" FROM r) - %s + v.i, 1), v.t, v.p, %s FROM (VALUES (%s, %s, %s::jsonb), (%s, %s, %s::jsonb)) AS v(i, t, p))
SELECT r."last_seq", r."cancel_requested_at", (SELECT count(*) FROM c0) FROM r
