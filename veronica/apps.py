from django.apps import AppConfig


class VeronicaConfig(AppConfig):
    name = "veronica"
    verbose_name = "Veronica swarm"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_q.signals import post_spawn

        from veronica import tracing
        from veronica.engine.warm import warm_worker

        tracing.configure()  # OTLP export only when OTEL_EXPORTER_OTLP_ENDPOINT is set
        post_spawn.connect(warm_worker, dispatch_uid="veronica.warm_worker")
