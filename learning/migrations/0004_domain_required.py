"""Rule domains become rows with an owner (schema, step 3 of 3): the string columns go, the foreign
keys become required."""
import django.db.models.deletion
from django.db import migrations, models

TABLES = ("rule", "proposal", "reflection", "rulechange")
RELATED = {"rule": "rules", "proposal": "proposals", "reflection": "reflections", "rulechange": "changes"}


class Migration(migrations.Migration):

    dependencies = [
        ('learning', '0003_domain_data'),
    ]

    operations = [
        *[migrations.RemoveField(model_name=t, name='domain_name') for t in TABLES],
        *[migrations.AlterField(
            model_name=t, name='domain',
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name=RELATED[t],
                                    to='learning.domain'),
        ) for t in TABLES],
        migrations.AddIndex(model_name='rule', index=models.Index(fields=['domain', 'source', 'enabled'], name='learning_rule_dse')),
        migrations.AlterField(
            model_name='rulechange', name='action',
            field=models.CharField(choices=[('add', 'Add'), ('edit', 'Edit'), ('remove', 'Remove'), ('apply', 'Apply'), ('enable', 'Enable'), ('disable', 'Disable'), ('revert', 'Revert'), ('split', 'Split')], max_length=10),
        ),
    ]
