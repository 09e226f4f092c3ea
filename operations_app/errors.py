"""Recent internal errors, recorded off the failing caller's path.

``internal_error`` runs where things just went wrong: inside a transaction that can no longer run a query, or on
an event loop where the ORM is refused. So the listener only puts the report on a bounded queue; one thread of
this process writes what is queued, on its own database connection (outside any caller's transaction), and gives
the connection back after each batch. A full queue drops the report (the log line with the same reference stays),
and a failed write is logged and dropped: recording an error never raises into, or waits on, its caller.
"""

from __future__ import annotations

import logging
import queue
import threading

from django.db import connections

from gateway.exceptions import InternalErrorReport

from .services import error_record

logger = logging.getLogger(__name__)

QUEUE_SIZE = 1000
BATCH_SIZE = 100


class ErrorRecorder:
    def __init__(self, *, queue_size: int = QUEUE_SIZE) -> None:
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
        """One batch, in one transaction on this thread's connection.

        A failure here (database down: often the very reason for the errors) is logged and the batch dropped;
        the errors themselves are in the log under their references."""
        try:
            error_record(reports=batch)
        except Exception:
            logger.warning("could not record %d internal errors (%s)", len(batch), ", ".join(r.error_id for r in batch))
        finally:
            connections.close_all()
            for _ in batch:
                self.pending.task_done()

    def drain(self, timeout_s: float) -> bool:
        """Wait until everything queued so far is written or dropped; whether it was within ``timeout_s``."""
        with self.pending.all_tasks_done:
            return self.pending.all_tasks_done.wait_for(lambda: self.pending.unfinished_tasks == 0, timeout_s)


error_recorder = ErrorRecorder()
