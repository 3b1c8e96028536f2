"""Joins the iss11-fix columns (0005, 0006) with the rule-domain migration (0004). They branch from
0003 so that migrating learning back before 0004 (tests/improve/test_rule_domain_migration.py)
unapplies only 0004 and this merge, never the member/turn columns every model query needs."""
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("veronica", "0004_rule_domains_per_space"),
        ("veronica", "0006_member_origin_removed_by"),
    ]

    operations = []
