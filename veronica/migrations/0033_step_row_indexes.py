# Issue 25 (pgcpu): a hosted step writes ~4 events and 2 turns; every index of those tables is one more
# index entry (and WAL record) per row. These three are covered by a composite index leading with the same
# column, or (kind) by none a query needs:
#   veronica_event.space_id  -> event_seq_unique_per_space (space_id, seq)
#   veronica_event.kind      -> reads by kind all name the member first (event_member_seq_idx, event_run_marks_idx)
#   veronica_turn.session_id -> turn_seq_unique (session_id, seq)
# Only the indexes are dropped: an AlterField would also drop and re-add (re-validate) the foreign keys.

import django.db.models.deletion
from django.db import migrations, models

DROPS = [
    ("veronica_event_space_id_ccab8339", "veronica_event", "space_id", False),
    ("veronica_event_kind_0f6d5f3a", "veronica_event", "kind", False),
    ("veronica_event_kind_0f6d5f3a_like", "veronica_event", "kind varchar_pattern_ops", True),
    ("veronica_turn_session_id_fca7544d", "veronica_turn", "session_id", False),
]


def drop(apps, schema_editor):
    for name, _, _, _ in DROPS:
        schema_editor.execute(f'DROP INDEX IF EXISTS "{name}"')


def restore(apps, schema_editor):
    for name, table, column, pg_only in DROPS:
        if pg_only and schema_editor.connection.vendor != "postgresql":
            continue
        schema_editor.execute(f'CREATE INDEX IF NOT EXISTS "{name}" ON "{table}" ({column})')


class Migration(migrations.Migration):

    dependencies = [
        ('veronica', '0032_member_fillfactor'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(drop, restore)],
            state_operations=[
                migrations.AlterField(
                    model_name='event',
                    name='kind',
                    field=models.CharField(max_length=60),
                ),
                migrations.AlterField(
                    model_name='event',
                    name='space',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='events', to='veronica.space'),
                ),
                migrations.AlterField(
                    model_name='turn',
                    name='session',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='turns', to='veronica.session'),
                ),
            ],
        ),
    ]
