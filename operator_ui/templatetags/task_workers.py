"""The console's banner when no Celery worker consumes the turn queue (``operator_ui/worker_warning.html``)."""

from __future__ import annotations

from typing import Any

from django import template

from gateway import task_consumers
from gateway.conf import gateway_setting

register = template.Library()


@register.simple_tag
def missing_task_worker() -> dict[str, Any] | None:
    """What the banner says when the latest check found the turn queue unconsumed, else None; never waits on the
    broker (a stale check is refreshed on its own thread and shows on the next page)."""
    consumers = task_consumers.consumer_watch.current()
    if not consumers.worker_missing:
        return None
    return {
        "queue": consumers.queue,
        "command": task_consumers.WORKER_COMMAND,
        "pickup_s": gateway_setting("TURN_PICKUP_TIMEOUT_S"),
    }
