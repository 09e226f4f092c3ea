from django.apps import AppConfig


class OperatorUiConfig(AppConfig):
    name = "operator_ui"
    verbose_name = "Operator console"
