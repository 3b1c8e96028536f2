from django.db import migrations, models


class Migration(migrations.Migration):
    """The lease index keyed by the token, not by the lease's end, which every fence and heartbeat
    moves: those updates become HOT (no new entry in each of the table's indexes)."""

    dependencies = [
        ('veronica', '0030_task_recent_idx'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='member',
            name='member_live_lease_idx',
        ),
        migrations.AddIndex(
            model_name='member',
            index=models.Index(condition=models.Q(('lease_token', ''), _negated=True), fields=['lease_token'], name='member_leased_idx'),
        ),
    ]
