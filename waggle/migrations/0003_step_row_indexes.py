# Every recorded tool call inserts a ForageCall row: space_key's own index (and, on PostgreSQL, its
# varchar_pattern_ops twin) duplicated waggle_fc_session_seq and waggle_fc_space_id, which lead with
# space_key; every read names the space (= space_key). Only the indexes are dropped (no table rebuild).

from django.db import migrations, models

DROPS = [("waggle_foragecall_space_key_707e4e78", "space_key", False),
         ("waggle_foragecall_space_key_707e4e78_like", "space_key varchar_pattern_ops", True)]


def drop(apps, schema_editor):
    for name, _, _ in DROPS:
        schema_editor.execute(f'DROP INDEX IF EXISTS "{name}"')


def restore(apps, schema_editor):
    for name, column, pg_only in DROPS:
        if pg_only and schema_editor.connection.vendor != "postgresql":
            continue
        schema_editor.execute(f'CREATE INDEX IF NOT EXISTS "{name}" ON "waggle_foragecall" ({column})')


class Migration(migrations.Migration):

    dependencies = [
        ('waggle', '0002_truthful_ledger_and_refs'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(drop, restore)],
            state_operations=[
                migrations.AlterField(
                    model_name='foragecall',
                    name='space_key',
                    field=models.CharField(max_length=64),
                ),
            ],
        ),
    ]
