"""Waiting for a decision from synchronous code: a turn in a Celery worker, or in a gateway thread.

The decision is in the database, so nothing is lost when the waiter (or the gateway process that would
have told it) goes away: a later wait reads it. While it waits, the waiter reads the settled flag the
deciding service sets in Django's cache every 50 ms, reads the row at most every second, and holds no
database connection in between.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from django.utils import timezone

from gateway.background import release_database_connections

from ..events import settled_flag
from ..models import ExecApproval
from ..selectors import approval_get, approval_not_found
from .approvals import exec_approval_expire

FLAG_POLL_S = 0.05
# An operator who answers at once (a console open on the approval, an automation) should not wait out a long
# poll: the flag is looked at this often for the first seconds of a wait, then every FLAG_POLL_S.
QUICK_FLAG_POLL_S = 0.005
QUICK_WINDOW_S = 5.0
DB_READ_INTERVAL_S = 1.0


def exec_approval_wait(approval_id: str, *, timeout_s: float, should_stop: Callable[[], bool]) -> ExecApproval:
    """The approval once it is settled, or once it expired (this marks it expired if the sweep has not), or
    as it is when ``should_stop()`` turns true or ``timeout_s`` passes (still pending: the caller decides —
    a turn that stops cancels it). Raises NotFound for an unknown id."""
    started = time.monotonic()
    deadline = started + max(0.0, timeout_s)
    approval = _read(approval_id)
    next_read = time.monotonic() + DB_READ_INTERVAL_S
    while True:
        if approval.is_terminal:
            return approval
        if approval.expires_at <= timezone.now():
            return exec_approval_expire(approval_id=approval_id) or _read(approval_id)
        if should_stop() or time.monotonic() >= deadline:
            return approval
        time.sleep(QUICK_FLAG_POLL_S if time.monotonic() - started < QUICK_WINDOW_S else FLAG_POLL_S)
        now = time.monotonic()
        if settled_flag(approval_id) is not None or now >= next_read:
            approval = _read(approval_id)
            next_read = now + DB_READ_INTERVAL_S


def _read(approval_id: str) -> ExecApproval:
    approval = approval_get(approval_id)
    # Given back at once: the next read is a second (or a wake-up) away, and a turn may wait half an hour.
    release_database_connections()
    if approval is None:
        raise approval_not_found()
    return approval
