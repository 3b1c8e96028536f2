"""API tokens: an optional expiry, a read-only scope, and a stamp of the password they were made
under (a password change ends them). Existing tokens are stamped with their user's current password
and keep working until it changes."""
import hashlib

from django.db import migrations, models


def stamp_existing(apps, schema_editor):
    ApiToken = apps.get_model("veronica", "ApiToken")
    for token in ApiToken.objects.select_related("user").filter(password_stamp=""):
        token.password_stamp = hashlib.sha256(token.user.password.encode()).hexdigest()
        token.save(update_fields=["password_stamp"])


class Migration(migrations.Migration):

    dependencies = [
        ('veronica', '0017_cockpit_a_member_tools'),
    ]

    operations = [
        migrations.AddField(
            model_name='apitoken',
            name='expires_at',
            field=models.DateTimeField(blank=True, help_text='Empty: never expires.', null=True),
        ),
        migrations.AddField(
            model_name='apitoken',
            name='password_stamp',
            field=models.CharField(blank=True, help_text="SHA-256 of the user's password hash at creation.", max_length=64),
        ),
        migrations.AddField(
            model_name='apitoken',
            name='read_only',
            field=models.BooleanField(default=False, help_text='Only GET (and the event stream); every change is refused.'),
        ),
        migrations.RunPython(stamp_existing, migrations.RunPython.noop),
    ]
