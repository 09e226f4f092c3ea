"""Periodic approval maintenance (Celery beat in production; the gateway's own loop when embedded)."""

from celery import shared_task

from .services import approvals


@shared_task(name="approvals.expire_sweep", acks_late=True, ignore_result=True)
def expire_sweep() -> dict:
    """Expire overdue pending approvals (their waiters apply their policy's askFallback)."""
    return {"expiredApprovals": approvals.exec_approvals_expire_due()}
