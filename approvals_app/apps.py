from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals_app"
    label = "approvals_app"
    verbose_name = "Exec approvals"

    def ready(self) -> None:
        from gateway import lifecycle

        # Importing the handler modules registers the exec.approval(s).* methods and events, and the
        # process notification that wakes waiting callers; importing the tasks registers the sweep.
        from . import rpc  # noqa: F401
        from .tasks import expire_sweep

        # Embedded profile: the gateway loop expires overdue approvals (production: Celery beat).
        lifecycle.on_sweep(expire_sweep)
