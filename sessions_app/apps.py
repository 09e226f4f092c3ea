from django.apps import AppConfig


class SessionsConfig(AppConfig):
    name = "sessions_app"
    label = "sessions_app"
    verbose_name = "Sessions"

    def ready(self) -> None:
        from gateway import lifecycle

        # Importing the handler modules registers the sessions.* / chat.* / agent.* methods and
        # events with the gateway core; importing the tasks registers sessions.run_turn.
        from . import chat_page_rpc, rpc  # noqa: F401
        from .services import runs
        from .tasks import runs_sweep

        # Embedded profile: the gateway runs turns itself, so it also recovers them at start and
        # sweeps periodically (production: Celery beat runs the sessions.runs_sweep task).
        lifecycle.on_startup(runs.runs_recover_dead_gateways)
        lifecycle.on_sweep(runs_sweep)
        # Production: every gateway process watches the Celery workers' leases, so that a killed worker's turns end
        # (and the turns it had not started run elsewhere) within seconds, with or without beat.
        lifecycle.on_watch(runs.runs_recover_stopped_workers)
        # Production without a worker: a queued turn fails after OPENCLAW_TURN_PICKUP_TIMEOUT_S instead of waiting
        # in silence (gateway/task_consumers.py).
        lifecycle.on_watch(runs.runs_fail_unclaimed)
