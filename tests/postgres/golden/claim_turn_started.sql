WITH c0 AS (INSERT INTO "agentrun_turn" ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "run_id", "index", "state", "is_final", "content", "message_id", "request_id", "model", "stop_reason", "model_attempts", "started_at", "finished_at") VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING "id"), r AS (UPDATE "agentrun_run" SET "updated_at" = %s, "last_seq" = "last_seq" + %s
WHERE "id" = %s AND "lease_epoch" = %s AND "lease_owner" = %s
RETURNING "last_seq", "cancel_requested_at"),
e AS (INSERT INTO "agentrun_runevent" ("run_id", "seq", "type", "payload", "created_at")
      SELECT %s, r."last_seq" - %s + v.i, v.t, v.p, %s FROM r, (VALUES (%s, %s, %s::jsonb)) AS v(i, t, p))
SELECT r."last_seq", r."cancel_requested_at", (SELECT array_agg("id" ORDER BY "id") FROM c0) FROM r
