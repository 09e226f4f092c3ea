"""Periodic device maintenance (Celery beat in production; the gateway's own loop when embedded)."""

from celery import shared_task

from .services import pairing


@shared_task(name="devices.pairing_sweep", acks_late=True, ignore_result=True)
def pairing_sweep() -> dict:
    """Expire overdue pairing requests."""
    return pairing.pairing_sweep()
