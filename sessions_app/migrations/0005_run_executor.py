"""``Run.worker`` becomes ``Run.executor`` (the process executing a turn), in the model only.

"Worker" is the workers app's word (worker environments, worker providers); the column keeps its
name, so no table is rewritten and nothing is copied.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0004_harness_ownership_and_upstream_links"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RenameField(model_name="run", old_name="worker", new_name="executor"),
                migrations.AlterField(
                    model_name="run",
                    name="executor",
                    field=models.CharField(blank=True, db_column="worker", max_length=200),
                ),
            ],
            database_operations=[],
        ),
    ]
