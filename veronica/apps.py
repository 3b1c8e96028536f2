from django.apps import AppConfig


class VeronicaConfig(AppConfig):
    name = "veronica"
    verbose_name = "Veronica swarm"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from veronica import tracing

        tracing.configure()  # OTLP export only when OTEL_EXPORTER_OTLP_ENDPOINT is set
