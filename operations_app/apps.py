from django.apps import AppConfig


class OperationsConfig(AppConfig):
    name = "operations_app"
    label = "operations_app"
    verbose_name = "Operations"
