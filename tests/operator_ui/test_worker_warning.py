"""The console's banner when no Celery worker consumes the turn queue (``templates/operator_ui/worker_warning.html``)
and the System page's ``taskWorkers`` warning, with the answer of the real broker (Redis) about a queue of the
test's own that no worker consumes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from django.core.cache import cache
from django.urls import reverse

from gateway import scopes as sc
from gateway import task_consumers
from gateway.task_consumers import UNCONSUMED_SINCE_KEY, ConsumerWatch, QueueState
from tests.support.operators import operator_user

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")

PROBE_WAIT_S = 15.0
BANNER = 'class="worker-warning"'


def watch_of(queue: str, settings, monkeypatch) -> ConsumerWatch:
    settings.OPENCLAW_TASK_MODE = "celery"
    settings.CELERY_TASK_DEFAULT_QUEUE = queue
    watch = ConsumerWatch()
    monkeypatch.setattr(task_consumers, "consumer_watch", watch)
    return watch


@pytest.fixture
def hostile_unconsumed_queue(settings, monkeypatch) -> Iterator[str]:
    """A queue name that is markup (it comes from the environment, and the page must escape it), unconsumed."""
    queue = f"<script>alert(1)</script>-{uuid.uuid4().hex[:8]}"
    answer = watch_of(queue, settings, monkeypatch).fresh(PROBE_WAIT_S)
    assert answer.state == QueueState.UNCONSUMED, answer
    yield queue
    cache.delete(UNCONSUMED_SINCE_KEY.format(queue))


@pytest.mark.redis
def test_every_console_page_warns_operators_that_no_worker_runs_turns(operator_client, hostile_unconsumed_queue):
    for name in ("ui:sessions", "ui:runs", "ui:nodes"):
        response = operator_client.get(reverse(name))

        assert response.status_code == 200
        page = response.content.decode()
        assert BANNER in page and 'role="alert"' in page
        assert "No Celery worker is consuming the turn queue" in page
        assert task_consumers.WORKER_COMMAND in page
        assert "and fail after 90 s" in page
        assert "<script>alert(1)</script>" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


@pytest.mark.redis
def test_the_login_page_shows_no_banner(client, hostile_unconsumed_queue):
    response = client.get(reverse("ui:login"))

    assert response.status_code == 200
    assert BANNER not in response.content.decode()


@pytest.mark.redis
def test_the_system_page_shows_the_warning_and_the_process_ready(client, hostile_unconsumed_queue):
    client.force_login(operator_user("boss", sc.ADMIN, is_staff=True))

    response = client.get(reverse("ui:system"))

    page = response.content.decode()
    assert response.status_code == 200
    assert response.context["readiness"].ready
    assert '<td data-label="Check">taskWorkers</td>' in page
    assert '<span class="pill pill-warn">warning</span>' in page
    assert "<script>alert(1)</script>" not in page


def test_no_banner_with_in_process_tasks(operator_client, settings):
    settings.OPENCLAW_TASK_MODE = "inprocess"

    page = operator_client.get(reverse("ui:sessions")).content.decode()

    assert BANNER not in page


@pytest.mark.redis
def test_no_banner_before_the_first_answer_nor_when_the_broker_does_not_answer(operator_client, settings, monkeypatch):
    """Only a check that found the queue unconsumed shows the banner: not one still in flight, nor a broker that
    did not answer."""
    watch = watch_of(f"test-banner-{uuid.uuid4().hex[:8]}", settings, monkeypatch)
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:9/0"  # the discard port: nothing listens

    before = operator_client.get(reverse("ui:sessions")).content.decode()
    watch.in_flight.result(PROBE_WAIT_S)
    after = operator_client.get(reverse("ui:sessions")).content.decode()

    assert watch.current().state == QueueState.UNKNOWN
    assert BANNER not in before and BANNER not in after
