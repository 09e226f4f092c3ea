"""The operations app's writes: the bounded store of recent internal errors."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence

from django.db import transaction

from gateway import state
from gateway.exceptions import InternalErrorReport

from .models import RecordedError

# What the System page lists; older ones are still in the log under their reference.
ERRORS_KEPT = 200


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def error_record(*, reports: Sequence[InternalErrorReport], keep: int = ERRORS_KEPT) -> int:
    """Store ``reports`` (from this process) and prune to the newest ``keep``; returns how many rows went."""
    hostname, pid = socket.gethostname(), os.getpid()
    with transaction.atomic():
        RecordedError.objects.bulk_create(
            RecordedError(
                error_id=report.error_id,
                context=_clip(report.context, 300),
                exception_class=_clip(report.exception_class, 200),
                first_line=_clip(report.first_line, 500),
                occurred_at=report.occurred_at,
                process_boot_id=state.BOOT_ID,
                hostname=_clip(hostname, 200),
                pid=pid,
            )
            for report in reports
        )
        oldest_kept = RecordedError.objects.order_by("-id").values_list("id", flat=True)[keep - 1 : keep].first()
        if oldest_kept is None:
            return 0
        deleted, _ = RecordedError.objects.filter(id__lt=oldest_kept).delete()
    return deleted
