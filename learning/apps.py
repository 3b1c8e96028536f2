from django.apps import AppConfig


class LearningConfig(AppConfig):
    name = "learning"
    verbose_name = "learning rules"
    default_auto_field = "django.db.models.BigAutoField"
