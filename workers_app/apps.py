from django.apps import AppConfig


class WorkersConfig(AppConfig):
    name = "workers_app"
    label = "workers_app"
    verbose_name = "Workers"

    def ready(self) -> None:
        # Filled into sessions_app's seams (sessions_app never imports this app).
        from sessions_app.extensions import action_guards, session_projections

        from .guards import placement_barrier
        from .selectors import placement_fields

        session_projections.register("placement", placement_fields)
        action_guards.register(placement_barrier)
