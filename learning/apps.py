from django.apps import AppConfig


class LearningConfig(AppConfig):
    name = "learning"
    verbose_name = "learning rules"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.core import checks

        from .checks import check_rule_domains

        checks.register(check_rule_domains, "learning")
