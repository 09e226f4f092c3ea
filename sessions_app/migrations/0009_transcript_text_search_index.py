from django.db import migrations

# The session index's transcript search (sessions_app.session_index): a GIN index over the tsvector of each
# message's text parts. The expression must stay exactly MessageTextVector's, or the planner cannot use it. A
# no-op on SQLite, whose search is a plain containment test.
INDEX = "transcript_text_search_idx"
CREATE = (
    f'CREATE INDEX IF NOT EXISTS "{INDEX}" ON "sessions_app_transcriptevent" USING GIN '
    "(to_tsvector('english'::regconfig, jsonb_path_query_array(\"body\", '$.content[*].text'))) "
    "WHERE \"type\" = 'message'"
)


def create_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f'DROP INDEX IF EXISTS "{INDEX}"')


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0008_session_revision"),
    ]

    operations = [migrations.RunPython(create_index, drop_index)]
