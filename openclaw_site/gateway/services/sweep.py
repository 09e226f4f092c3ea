"""The periodic clean-up of the gateway core (Celery beat in production; the gateway loop when embedded)."""

from __future__ import annotations

import logging

from django.db import transaction

from ..selectors import live_connections, stale_processes
from . import connections, pairing

logger = logging.getLogger(__name__)


def gateway_sweep() -> dict:
    """Expire overdue pairing requests; forget processes (and their connections) that stopped heartbeating."""
    with transaction.atomic():
        expired = pairing.pairing_requests_expire()
        for request in expired:
            pairing.pairing_request_publish_resolved(request, "expired")
        dead = list(stale_processes().values_list("boot_id", flat=True))
    for boot_id in dead:
        connections.process_unregister(boot_id=str(boot_id))
    if dead:
        logger.warning("forgot %d gateway process(es) that stopped heartbeating", len(dead))
    return {"expiredRequests": len(expired), "deadProcesses": len(dead), "liveConnections": live_connections().count()}
