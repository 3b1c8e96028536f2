"""Rule domains become rows with an owner (schema, step 1 of 3): the Domain table, and a nullable
`domain` foreign key next to each old string column (renamed `domain_name` until 0003 copies it)."""
import django.db.models.deletion
from django.db import migrations, models

TABLES = ("rule", "proposal", "reflection", "rulechange")
RELATED = {"rule": "rules", "proposal": "proposals", "reflection": "reflections", "rulechange": "changes"}


class Migration(migrations.Migration):

    dependencies = [
        ('learning', '0001_initial'),
    ]

    operations = [
        migrations.CreateModel(
            name='Domain',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=64)),
                ('owner', models.CharField(blank=True, db_index=True, help_text='Opaque key of the owner (Veronica: "space:<id>"). Empty: global, or unowned.', max_length=100)),
                ('is_global', models.BooleanField(default=False, help_text='Shared by every owner that routes global:<name>. Staff only.')),
                ('note', models.TextField(blank=True, help_text='Where the domain came from (e.g. a migration split).')),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('created_by', models.CharField(blank=True, max_length=150)),
            ],
            options={
                'ordering': ['-is_global', 'owner', 'name'],
                'constraints': [
                    models.UniqueConstraint(fields=('owner', 'is_global', 'name'), name='learning_domain_owner_name_uniq'),
                    models.CheckConstraint(condition=models.Q(('is_global', False), ('owner', ''), _connector='OR'), name='learning_domain_global_has_no_owner'),
                ],
            },
        ),
        migrations.RemoveIndex(model_name='rule', name='learning_rule_dse'),
        *[migrations.RenameField(model_name=t, old_name='domain', new_name='domain_name') for t in TABLES],
        *[migrations.AddField(
            model_name=t, name='domain',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT, related_name=RELATED[t],
                                    to='learning.domain'),
        ) for t in TABLES],
    ]
