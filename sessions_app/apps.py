from django.apps import AppConfig


class SessionsConfig(AppConfig):
    name = "sessions_app"
    label = "sessions_app"
    verbose_name = "Sessions"

    def ready(self) -> None:
        # Registers the sessions.* / chat.* / agent.* methods and events with the gateway core.
        from openclaw_site.gateway import runtime

        from . import rpc, services, tasks  # noqa: F401

        # Embedded profile: the gateway runs turns itself, so it also recovers them at start and
        # sweeps periodically (production: Celery beat runs tasks.runs_sweep).
        runtime.on_startup(services.runs_recover_dead_gateways)
        runtime.on_sweep(tasks.runs_sweep)
