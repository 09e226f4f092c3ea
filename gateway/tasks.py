"""Periodic gateway maintenance (Celery beat in production; the gateway's own loop when embedded)."""

from celery import shared_task

from .services import sweep


@shared_task(name="gateway.sweep", acks_late=True, ignore_result=True)
def gateway_sweep() -> dict:
    """Forget gateway processes that stopped heartbeating (and their connections)."""
    return sweep.gateway_sweep()
