from django.apps import AppConfig


class OperationsConfig(AppConfig):
    name = "operations_app"
    label = "operations_app"
    verbose_name = "Operations"

    def ready(self) -> None:
        # Models must be loaded before the recorder's modules are imported.
        from gateway.exceptions import on_internal_error

        from .errors import error_recorder

        on_internal_error(error_recorder)

        # Importing the handler module registers logs.tail, usage.status, usage.cost and sessions.usage.
        from . import pricing, rpc  # noqa: F401

        # A price that cannot be used stops the start (one line naming the model and the field).
        pricing.model_prices()
