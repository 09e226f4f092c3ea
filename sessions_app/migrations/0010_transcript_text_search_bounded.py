from django.db import migrations

# The index of migration 0009 made PostgreSQL compute a message's tsvector at every insert, and a tsvector has a
# hard limit of 1 MB: a message of about 600,000 characters of distinct words (a pasted log of ids) could not be
# stored at all ("string is too long for tsvector"). This index reads only the first 60,000 characters of the
# message's text parts (the console draws no more of a message either), at most about 300 KB of tsvector for the
# most unfavourable text. The parts are read as their JSON array's text with every escape (\n, \", \u0001 ...)
# turned into a space, so that "a\nb" is two words as before. The expression must stay exactly
# sessions_app.session_index.MessageTextVector's, or the planner cannot use the index. A no-op on SQLite.
INDEX = "transcript_text_search_idx"
TABLE = "sessions_app_transcriptevent"
BOUNDED = (
    "to_tsvector('english'::regconfig, regexp_replace("
    "left((jsonb_path_query_array(\"body\", '$.content[*].text'))::text, 60000), "
    "'\\\\(u[0-9a-fA-F]{4}|.)', ' ', 'g'))"
)
UNBOUNDED = "to_tsvector('english'::regconfig, jsonb_path_query_array(\"body\", '$.content[*].text'))"


def _create(schema_editor, expression: str) -> None:
    schema_editor.execute(f'DROP INDEX IF EXISTS "{INDEX}"')
    schema_editor.execute(
        f'CREATE INDEX "{INDEX}" ON "{TABLE}" USING GIN (({expression})) WHERE "type" = \'message\''
    )


def bounded(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        _create(schema_editor, BOUNDED)


def unbounded(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        _create(schema_editor, UNBOUNDED)


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0009_transcript_text_search_index"),
    ]

    operations = [migrations.RunPython(bounded, unbounded)]
