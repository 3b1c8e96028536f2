from django.apps import AppConfig


class VeronicaConfig(AppConfig):
    name = "veronica"
    verbose_name = "Veronica swarm"
    default_auto_field = "django.db.models.BigAutoField"
