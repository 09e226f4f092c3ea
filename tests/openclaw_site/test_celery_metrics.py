"""Celery task outcomes are counted once per execution by the signals ``openclaw_site.celery`` connects, under the
task's registered name ("unknown" for anything else, so that the label stays bounded)."""

from __future__ import annotations

from celery.signals import task_failure, task_retry, task_success
from prometheus_client import REGISTRY

from gateway.tasks import gateway_sweep


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_each_outcome_is_counted_under_the_tasks_name():
    task = gateway_sweep
    before = {
        outcome: sample("openclaw_celery_tasks_total", task="gateway.sweep", outcome=outcome)
        for outcome in ("success", "failure", "retry")
    }

    task_success.send(sender=task, result=None)
    task_failure.send(sender=task, task_id="t1", exception=RuntimeError("boom"), args=(), kwargs={}, einfo=None)
    task_retry.send(sender=task, request=None, reason="transient", einfo=None)

    for outcome in ("success", "failure", "retry"):
        assert sample("openclaw_celery_tasks_total", task="gateway.sweep", outcome=outcome) == before[outcome] + 1


def test_a_task_the_app_does_not_know_is_counted_as_unknown():
    class Stranger:
        name = "somebody.elses.task-1234"

    before = sample("openclaw_celery_tasks_total", task="unknown", outcome="success")

    task_success.send(sender=Stranger(), result=None)

    assert sample("openclaw_celery_tasks_total", task="unknown", outcome="success") == before + 1
    assert sample("openclaw_celery_tasks_total", task="somebody.elses.task-1234", outcome="success") == 0
