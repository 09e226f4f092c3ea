from django.apps import AppConfig


class DevicesConfig(AppConfig):
    name = "devices_app"
    label = "devices_app"
    verbose_name = "Devices and pairing"

    def ready(self) -> None:
        from gateway import lifecycle
        from gateway.ports import provide_connection_authority

        # Importing the handler module registers the device.*, node.pair.* and node catalog methods.
        from . import rpc  # noqa: F401
        from .connect import connection_authority
        from .tasks import pairing_sweep

        provide_connection_authority(connection_authority)
        # Embedded profile: the gateway loop expires pairing requests (production: Celery beat).
        lifecycle.on_sweep(pairing_sweep)
