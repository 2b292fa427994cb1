"""Each byte of a model's answer and of a tool's result written once (issue #38): a turn's
content is kept by the model_response event that records it, a call's result by the event
that recorded it (its closing, or its last replacement), and the rows name those events by
their seqs (`content_seq`, `result_seq`) instead of holding copies (models/recorded.py;
docs/explanation/storage.md, "Written once").

Forward: the nullable columns `content_seq` and `result_seq` (no default, no constraint:
Postgres adds them without rewriting or scanning the table), the fields' classes (a state
change: the columns stay as they are), and the engine's write function (queries.sql
`write_function`, a frozen copy below) storing the seqs for new answers and results.
Existing rows keep their values inline and are read as they are: nothing is copied,
nothing locked for longer than the ALTERs' catalog changes. Backward: the values of the
rows that name their events copied back into the columns, then the columns dropped and
0013's function installed again.
"""

import importlib

from django.db import migrations, models

import django_agentrun.fields
import django_agentrun.models.recorded

FUNCTION = r"""
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
"""

# The content of each turn that names its event, back into its row (unapplying).
# The values of the rows that name their events, back into the rows (unapplying).
_INLINE = {
    "postgresql": """
UPDATE "{table}" AS t SET "{column}" = (
  SELECT e."events" -> (t."{seq}" - e."seq") -> 1 -> '{key}'
  FROM "agentrun_runeventrow" AS e
  WHERE e."run_id" = t."run_id" AND e."seq" <= t."{seq}"
  ORDER BY e."seq" DESC LIMIT 1
) WHERE t."{seq}" IS NOT NULL
""",
    "sqlite": """
UPDATE "{table}" SET "{column}" = (
  SELECT e."events" -> ('$[' || ("{table}"."{seq}" - e."seq") || '][1].{key}')
  FROM "agentrun_runeventrow" AS e
  WHERE e."run_id" = "{table}"."run_id" AND e."seq" <= "{table}"."{seq}"
  ORDER BY e."seq" DESC LIMIT 1
) WHERE "{seq}" IS NOT NULL
""",
}
RECORDED = [
    {"table": "agentrun_turn", "column": "content", "seq": "content_seq", "key": "content"},
    {"table": "agentrun_toolcall", "column": "result", "seq": "result_seq", "key": "result"},
]


def install(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FUNCTION)


def uninstall(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor not in _INLINE:
        raise NotImplementedError(f"django-agentrun runs on Postgres or SQLite, not {vendor}")
    if vendor == "postgresql":
        previous = importlib.import_module("django_agentrun.migrations.0013_eventrows_commit_rows")
        schema_editor.execute(previous.FUNCTION)
    for names in RECORDED:
        schema_editor.execute(_INLINE[vendor].format(**names))


class Migration(migrations.Migration):
    dependencies = [("agentrun", "0019_run_phase")]

    operations = [
        migrations.AlterModelOptions(
            name="turn",
            options={"base_manager_name": "objects", "ordering": ["run", "index"]},
        ),
        migrations.AddField(
            model_name="turn",
            name="content_seq",
            field=models.IntegerField(
                blank=True,
                help_text="The seq of the model_response event whose content this is "
                "(models/recorded.py).",
                null=True,
            ),
        ),
        migrations.AlterField(
            model_name="turn",
            name="content",
            field=django_agentrun.models.recorded.RecordedField(
                blank=True,
                decoder=django_agentrun.fields.StorableJSONDecoder,
                encoder=django_agentrun.fields.StorableJSONEncoder,
                help_text="The assistant content blocks, as the API returned them (in the column "
                "only on rows no event holds them for: content_seq).",
                null=True,
                seq_field="content_seq",
            ),
        ),
        migrations.AlterModelOptions(
            name="toolcall",
            options={
                "base_manager_name": "objects",
                "ordering": ["run", "turn_index", "position"],
                "permissions": [("approve_toolcall", "Can approve, reject and resolve tool calls")],
            },
        ),
        migrations.AddField(
            model_name="toolcall",
            name="result_seq",
            field=models.IntegerField(
                blank=True,
                help_text="The seq of the event that recorded the result the call holds now "
                "(its closing, or the last replacement: models/recorded.py).",
                null=True,
            ),
        ),
        migrations.AlterField(
            model_name="toolcall",
            name="result",
            field=django_agentrun.models.recorded.RecordedField(
                blank=True,
                decoder=django_agentrun.fields.StorableJSONDecoder,
                encoder=django_agentrun.fields.StorableJSONEncoder,
                help_text="The result: a JSON value, or content blocks (result_format); in the "
                "column only on rows no event holds it for (result_seq).",
                null=True,
                seq_field="result_seq",
            ),
        ),
        # After the columns (the function inserts them); unapplied before they are dropped.
        migrations.RunPython(install, uninstall, elidable=False),
    ]
