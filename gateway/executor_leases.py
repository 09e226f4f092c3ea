"""Leases of the Celery worker processes: a killed worker is known stopped within seconds, not after the turns'
heartbeat silence.

Each worker process renews a lease, a key of the shared cache (Redis) that expires ``EXECUTOR_LEASE_TTL_MS`` after
its last renewal, from a thread of its own every ``EXECUTOR_LEASE_RENEW_MS``: the renewal waits on no task, no
database pool and no model. A second key with a day's expiry says that the process holds a lease at all; a process
is *stopped* only when that key is there and its lease is not. So a process that never held one (another version,
a test driving a turn by hand) and an emptied cache (both keys gone) prove nothing, and the turn's own heartbeat
silence still ends what they ran.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Iterable

from django.core.cache import cache

from .background import CELERY_EXECUTOR_PREFIX, worker_process_label
from .conf import gateway_setting

logger = logging.getLogger(__name__)

LEASE_KEY = "gateway:executor-lease:{}"
HOLDER_KEY = "gateway:executor-holder:{}"
HOLDER_TTL_S = 24 * 3600
# A cache that stays unreachable is logged once a minute, not at every renewal.
FAILURE_LOG_INTERVAL_S = 60.0


def lease_ttl_s() -> int:
    """The lease's expiry in whole seconds (the cache's unit), rounded up."""
    return math.ceil(gateway_setting("EXECUTOR_LEASE_TTL_MS") / 1000)


def lease_renew(label: str) -> None:
    """One renewal: the lease first, then the holder mark, so that a reader between the two never sees a holder
    without its lease."""
    cache.set(LEASE_KEY.format(label), 1, timeout=lease_ttl_s())
    cache.set(HOLDER_KEY.format(label), 1, timeout=HOLDER_TTL_S)


def stopped_executors(labels: Iterable[str]) -> set[str]:
    """Those of ``labels`` (executors of running turns) that are Celery worker processes which held a lease and no
    longer renew it."""
    workers = sorted({label for label in labels if label.startswith(CELERY_EXECUTOR_PREFIX)})
    if not workers:
        return set()
    keys = [key for label in workers for key in (LEASE_KEY.format(label), HOLDER_KEY.format(label))]
    found = cache.get_many(keys)
    return {label for label in workers if HOLDER_KEY.format(label) in found and LEASE_KEY.format(label) not in found}


class _Holder:
    """The renewing thread of this process (a forked child starts its own: threads do not survive a fork)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid: int | None = None


_holder = _Holder()


def hold_lease() -> None:
    """Start renewing this worker process's lease (once per process; Celery's ``worker_ready`` and
    ``worker_process_init`` call it, openclaw_site/celery.py)."""
    with _holder.lock:
        if _holder.pid == os.getpid():
            return
        _holder.pid = os.getpid()
        label = worker_process_label()
        thread = threading.Thread(target=_renew_forever, args=(label,), name="executor-lease", daemon=True)
        thread.start()
        logger.debug("holding executor lease %s (ttl %d s)", label, lease_ttl_s())


def _renew_forever(label: str) -> None:
    interval_s = gateway_setting("EXECUTOR_LEASE_RENEW_MS") / 1000
    logged_failure_at: float | None = None
    while True:
        try:
            lease_renew(label)
            logged_failure_at = None
        except Exception:
            # The cache is unreachable: the next renewal retries; past the expiry this process counts as stopped.
            now = time.monotonic()
            if logged_failure_at is None or now - logged_failure_at >= FAILURE_LOG_INTERVAL_S:
                logged_failure_at = now
                logger.exception("executor lease %s not renewed", label)
        time.sleep(interval_s)
