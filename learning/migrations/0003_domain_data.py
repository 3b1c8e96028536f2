"""Rule domains become rows with an owner (data, step 2 of 3). Every old domain string becomes an
UNOWNED domain: learning does not know the host's tenants, so nothing here may guess an owner.
Unowned domains are routed to no one (staff see them in the admin); the host's own migration
(Veronica: veronica/migrations/0004_rule_domains_per_space.py) then hands each to the space(s) that
route it."""
from django.db import migrations

TABLES = ("Rule", "Proposal", "Reflection", "RuleChange")
NOTE = "created by learning migration 0003 from the shared domain string {name!r}; no owner yet"


def forwards(apps, schema_editor):
    Domain = apps.get_model("learning", "Domain")
    names = set()
    for table in TABLES:
        names |= set(apps.get_model("learning", table).objects.values_list("domain_name", flat=True).distinct())
    for name in sorted(names):
        domain, _ = Domain.objects.get_or_create(owner="", is_global=False, name=name,
                                                 defaults={"note": NOTE.format(name=name), "created_by": "migration"})
        for table in TABLES:
            apps.get_model("learning", table).objects.filter(domain_name=name).update(domain=domain)


def backwards(apps, schema_editor):
    Domain = apps.get_model("learning", "Domain")
    for table in TABLES:
        model = apps.get_model("learning", table)
        for domain in Domain.objects.all():
            model.objects.filter(domain=domain).update(domain_name=domain.name)


class Migration(migrations.Migration):

    dependencies = [
        ('learning', '0002_domain'),
    ]

    operations = [
        migrations.RunPython(forwards, backwards),
    ]
