import time

from django.apps import AppConfig

STARTED_AT = time.time()  # when Django set this process up: /metrics' process start time (uptime anchor)


class VeronicaConfig(AppConfig):
    name = "veronica"
    verbose_name = "Veronica swarm"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created
        from django_q.signals import post_spawn

        from waggle import guard as waggle_guard

        from veronica.swarm import audit, events
        from veronica.ops import tracing
        from veronica.engine.warm import warm_worker
        from veronica.plumbing import begin_rides

        audit.connect_signals()  # logins, failed logins and logouts are audit rows
        tracing.configure()  # OTLP export only when OTEL_EXPORTER_OTLP_ENDPOINT is set
        post_spawn.connect(warm_worker, dispatch_uid="veronica.warm_worker")
        connection_created.connect(begin_rides.adopt, dispatch_uid="veronica.begin_rides")  # a step's BEGIN costs no round trip
        # waggle's row of a step's tool call rides in the step's event statement (no round trip of its own)
        waggle_guard.host_defers(events.defer_insert)
