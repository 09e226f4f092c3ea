from django.apps import AppConfig


class OperationsConfig(AppConfig):
    name = "operations_app"
    label = "operations_app"
    verbose_name = "Operations"

    def ready(self) -> None:
        # Importing the handler module registers the operations methods (logs.tail).
        from . import rpc  # noqa: F401
