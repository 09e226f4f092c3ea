from django.apps import AppConfig


class NativeHarnessConfig(AppConfig):
    name = "native_harness"
    label = "native_harness"
    verbose_name = "Native harness"

    def ready(self) -> None:
        # Registers the bundled harness with sessions_app (which never imports this app).
        from . import harness  # noqa: F401
