"""The periodic clean-up of the gateway core (Celery beat in production; the gateway loop when embedded)."""

from __future__ import annotations

import logging

from ..ports import connection_authority
from ..selectors import dead_process_boot_ids, live_connections

logger = logging.getLogger(__name__)


def gateway_sweep() -> dict:
    """Forget dead processes (and their connections): those that stopped heartbeating, and killed ones of
    this host."""
    dead = dead_process_boot_ids()
    for boot_id in dead:
        connection_authority().process_unregister(boot_id=boot_id)
    if dead:
        logger.warning("forgot %d gateway process(es) that stopped heartbeating", len(dead))
    return {"deadProcesses": len(dead), "liveConnections": live_connections().count()}
