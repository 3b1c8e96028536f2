from django.apps import AppConfig


class WaggleConfig(AppConfig):
    name = "waggle"
    verbose_name = "waggle procedure memory"
    default_auto_field = "django.db.models.BigAutoField"
