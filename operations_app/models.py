from __future__ import annotations

from django.db import models


class RecordedError(models.Model):
    """An unexpected failure a client was told about by reference (``internal_error``), kept for the console's
    System page. Bounded: only the newest ``ERRORS_KEPT`` rows stay (``services.error_record``)."""

    error_id = models.CharField(max_length=32, db_index=True)
    context = models.CharField(max_length=300)
    exception_class = models.CharField(max_length=200, blank=True)
    # Operators only: clients get the reference, never this text.
    first_line = models.CharField(max_length=500, blank=True)
    occurred_at = models.DateTimeField()
    process_boot_id = models.CharField(max_length=64)
    hostname = models.CharField(max_length=200)
    pid = models.IntegerField()

    class Meta:
        # The System page lists the newest; pruning keeps the newest by id.
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.error_id} {self.context}"
