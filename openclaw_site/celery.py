import os

from celery import Celery
from celery.signals import task_failure, task_retry, task_success, worker_process_init, worker_ready

from gateway.executor_leases import hold_lease
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


# Every process that runs tasks holds a lease, so that a killed one is known within seconds
# (gateway/executor_leases.py): the worker itself (threads and solo pools run tasks in it) and each forked child of
# the prefork pool.
@worker_ready.connect(weak=False)
def _hold_lease_of_the_worker(sender=None, **kwargs):
    hold_lease()


@worker_process_init.connect(weak=False)
def _hold_lease_of_a_pool_process(sender=None, **kwargs):
    hold_lease()
