# The rule-domain migration (which depends on learning's) and the engine / ops / member-view / MCP
# migrations are two independent lines from 0003; this joins them. Kept apart so that unapplying
# learning's domain migrations (tests/improve/test_rule_domain_migration.py) unapplies only veronica 0004.
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("veronica", "0004_rule_domains_per_space"),
        ("veronica", "0012_mcp_servers"),
    ]
    operations = []
