from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "gateway"
    label = "gateway"
    verbose_name = "Gateway"

    def ready(self) -> None:
        # Filling the method registry is a side effect of importing the handler modules.
        from . import absent_features, lifecycle, rpc, task_consumers  # noqa: F401

        # Celery task mode: a WARNING at start when no worker consumes the turn queue.
        lifecycle.on_startup(task_consumers.start_watching)
