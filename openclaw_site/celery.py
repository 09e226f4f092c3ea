import os

from celery import Celery
from celery.signals import task_failure, task_retry, task_success

from gateway.metrics import record_task_outcome

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "openclaw_site.settings")

app = Celery("openclaw_site")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


# Task outcomes for /metrics (gateway/metrics.py), counted in the worker that ran the task. Connected here, once
# per process, with weak=False: the receivers are module functions that live as long as the process anyway.
def _task_name(sender) -> str:
    name = getattr(sender, "name", None)
    return name if name in app.tasks else "unknown"


@task_success.connect(weak=False)
def _count_task_success(sender=None, **kwargs):
    record_task_outcome(_task_name(sender), "success")


@task_failure.connect(weak=False)
def _count_task_failure(sender=None, **kwargs):
    record_task_outcome(_task_name(sender), "failure")


@task_retry.connect(weak=False)
def _count_task_retry(sender=None, **kwargs):
    record_task_outcome(_task_name(sender), "retry")
