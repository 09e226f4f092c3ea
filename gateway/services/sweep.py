"""The periodic clean-up of the gateway core (Celery beat in production; the gateway loop when embedded)."""

from __future__ import annotations

import logging

from django.db import transaction

from ..selectors import dead_process_boot_ids, live_connections
from . import connections, pairing

logger = logging.getLogger(__name__)


def gateway_sweep() -> dict:
    """Expire overdue pairing requests; forget dead processes (and their connections): those that stopped
    heartbeating, and killed ones of this host."""
    with transaction.atomic():
        expired = pairing.pairing_requests_expire()
        for request in expired:
            pairing.pairing_request_publish_resolved(request, "expired")
        dead = dead_process_boot_ids()
    for boot_id in dead:
        connections.process_unregister(boot_id=boot_id)
    if dead:
        logger.warning("forgot %d gateway process(es) that stopped heartbeating", len(dead))
    return {"expiredRequests": len(expired), "deadProcesses": len(dead), "liveConnections": live_connections().count()}
