from django.db import migrations

# A member row is updated at every step of its runs (the fence: the lease's end, the phase) and every
# heartbeat. Such an update is HOT (no new entry in each of the table's ten indexes) only when the row's
# page has room for the new version: with pages filled to 100 %, 42 % of them were not
# (bench/fleet_profile.py, 250 members, pg_stat_user_tables). 70 % leaves that room; the table is
# small (one row per member), the space is cheap. PostgreSQL only: SQLite has no such setting.
FILL = 70


def fill(apps, schema_editor, percent=FILL):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE veronica_member SET (fillfactor = {int(percent)})")


def unfill(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE veronica_member RESET (fillfactor)")


class Migration(migrations.Migration):
    dependencies = [
        ('veronica', '0031_member_hot_lease'),
    ]

    operations = [
        migrations.RunPython(fill, unfill),
    ]
