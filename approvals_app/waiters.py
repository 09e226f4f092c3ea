"""Waiting for a decision on the event loop (``exec.approval.waitDecision``, ``exec.approval.request``).

A waiter holds neither a thread nor a database connection while it waits: it sleeps on an event that the
approval's settled notification (``events.APPROVAL_SETTLED``, sent to every gateway process) sets, and
reads the row itself (one database hop) when it starts, when it is woken, when the approval reaches its
expiry (it expires it, if nobody did) and at least every :data:`RECHECK_S` (a lost notification only
delays the answer). The wait ends with the approval: by its expiry at the latest, or when the request is
cancelled (the client cancels it, or goes away).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

from channels.db import database_sync_to_async
from django.utils import timezone

from gateway import state

from .events import APPROVAL_SETTLED
from .models import ExecApproval
from .selectors import approval_get
from .services.approvals import exec_approval_expire

RECHECK_S = 5.0


class ApprovalWaiters:
    """The waiting calls of this process, per approval id (touched on the event loop only)."""

    def __init__(self) -> None:
        self._events: dict[str, set[asyncio.Event]] = defaultdict(set)

    def add(self, approval_id: str) -> asyncio.Event:
        event = asyncio.Event()
        self._events[approval_id].add(event)
        return event

    def discard(self, approval_id: str, event: asyncio.Event) -> None:
        events = self._events.get(approval_id)
        if events is not None:
            events.discard(event)
            if not events:
                del self._events[approval_id]

    def settled(self, approval_id: str) -> None:
        for event in self._events.get(approval_id, ()):
            event.set()

    def waiting(self, approval_id: str) -> int:
        return len(self._events.get(approval_id, ()))


approval_waiters = ApprovalWaiters()
state.on_process_message(APPROVAL_SETTLED, lambda message: approval_waiters.settled(str(message.get("id", ""))))


def _read(approval_id: str) -> ExecApproval | None:
    approval = approval_get(approval_id)
    if approval is not None and not approval.is_terminal and approval.expires_at <= timezone.now():
        return exec_approval_expire(approval_id=approval_id) or approval_get(approval_id)
    return approval


async def wait_for_settled(approval_id: str) -> ExecApproval | None:
    """The approval once it is no longer pending (None: there is no such approval)."""
    # Registered before the first read: a decision between the read and the sleep still wakes it.
    woken = approval_waiters.add(approval_id)
    try:
        while True:
            woken.clear()
            approval = await database_sync_to_async(_read)(approval_id)
            if approval is None or approval.is_terminal:
                return approval
            until_expiry = (approval.expires_at - timezone.now()).total_seconds()
            try:
                await asyncio.wait_for(woken.wait(), max(0.01, min(RECHECK_S, until_expiry)))
            except TimeoutError:
                pass  # its expiry, or the periodic re-read
    finally:
        approval_waiters.discard(approval_id, woken)
