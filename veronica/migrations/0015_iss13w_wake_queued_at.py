from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('veronica', '0014_iss10_approval_started_at'),
    ]

    operations = [
        migrations.AddField(
            model_name='member',
            name='wake_queued_at',
            field=models.DateTimeField(blank=True, help_text='A mail wake is queued, or a run holds the slot and looks at the mailbox when it ends: further mail rings nothing (veronica.engine.wakes.ring).', null=True),
        ),
    ]
