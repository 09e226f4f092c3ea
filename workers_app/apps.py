from django.apps import AppConfig


class WorkersConfig(AppConfig):
    name = "workers_app"
    label = "workers_app"
    verbose_name = "Workers"
