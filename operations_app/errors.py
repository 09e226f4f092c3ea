"""Recent internal errors, recorded off the failing caller's path.

``internal_error`` runs where things just went wrong: inside a transaction that can no longer run a query, or on
an event loop where the ORM is refused. So the listener only puts the report on a bounded queue; one thread of
this process writes what is queued, on its own database connection (outside any caller's transaction), and gives
the connection back after each attempt. A write that fails (the database away: often the very reason for the
errors) is tried again after :data:`RETRY_DELAYS_S`, then logged and dropped; meanwhile the queue fills, and a full
queue drops new reports (their log lines, with the same references, stay). Recording an error never raises into,
or waits on, its caller.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence

from django.db import connections

from gateway.exceptions import InternalErrorReport

from .services import error_record

logger = logging.getLogger(__name__)

QUEUE_SIZE = 1000
BATCH_SIZE = 100
# About a minute of retries: long enough for a database restart or failover, after which the errors it caused
# are on the System page too.
RETRY_DELAYS_S = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0)


class ErrorRecorder:
    def __init__(self, *, queue_size: int = QUEUE_SIZE, retry_delays_s: Sequence[float] = RETRY_DELAYS_S) -> None:
        self.retry_delays_s = tuple(retry_delays_s)
        self.pending: queue.Queue[InternalErrorReport] = queue.Queue(maxsize=queue_size)
        self.lock = threading.Lock()
        self.writer: threading.Thread | None = None
        self.dropped = 0

    def __call__(self, report: InternalErrorReport) -> None:
        try:
            self.pending.put_nowait(report)
        except queue.Full:
            self.dropped += 1
            return
        self.ensure_writer()

    def ensure_writer(self) -> None:
        with self.lock:
            if self.writer is None or not self.writer.is_alive():
                self.writer = threading.Thread(target=self.write_forever, name="operations-error-recorder", daemon=True)
                self.writer.start()

    def write_forever(self) -> None:
        while True:
            batch = [self.pending.get()]
            while len(batch) < BATCH_SIZE:
                try:
                    batch.append(self.pending.get_nowait())
                except queue.Empty:
                    break
            self.write(batch)

    def write(self, batch: list[InternalErrorReport]) -> None:
        """One batch, in one transaction on this thread's connection, retried after each of ``retry_delays_s``."""
        references = ", ".join(report.error_id for report in batch)
        try:
            for delay in (*self.retry_delays_s, None):
                try:
                    error_record(reports=batch)
                    return
                except Exception:
                    # Whatever the database raised: the errors stay in the log under their references either way.
                    if delay is None:
                        logger.warning(
                            "could not record %d internal errors (%s)", len(batch), references, exc_info=True
                        )
                        return
                    logger.info("recording %d internal errors failed; again in %g s", len(batch), delay)
                finally:
                    connections.close_all()
                time.sleep(delay)
        finally:
            for _ in batch:
                self.pending.task_done()

    def drain(self, timeout_s: float) -> bool:
        """Wait until everything queued so far is written or dropped; whether it was within ``timeout_s``."""
        with self.pending.all_tasks_done:
            return self.pending.all_tasks_done.wait_for(lambda: self.pending.unfinished_tasks == 0, timeout_s)


error_recorder = ErrorRecorder()
