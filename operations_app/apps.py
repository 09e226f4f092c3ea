from django.apps import AppConfig


class OperationsConfig(AppConfig):
    name = "operations_app"
    label = "operations_app"
    verbose_name = "Operations"

    def ready(self) -> None:
        # Importing the handler module registers usage.status, usage.cost and sessions.usage.
        from . import pricing, rpc  # noqa: F401

        # A price that cannot be used stops the start (one line naming the model and the field).
        pricing.model_prices()
