from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "gateway"
    label = "gateway"
    verbose_name = "Gateway"

    def ready(self) -> None:
        # Filling the method registry is a side effect of importing the handler modules.
        from . import absent_features, rpc  # noqa: F401
