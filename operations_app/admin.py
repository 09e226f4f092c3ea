from __future__ import annotations

from django.contrib import admin

from gateway.admin.common import ReadOnlyAdmin

from .models import RecordedError


@admin.register(RecordedError)
class RecordedErrorAdmin(ReadOnlyAdmin):
    """The recent internal errors of the console's System page; a client's reference finds its row (and the
    traceback is in that process's log under the same reference)."""

    list_display = ("occurred_at", "error_id", "context", "exception_class", "first_line", "hostname", "pid")
    list_filter = ("exception_class",)
    search_fields = ("=error_id", "context", "process_boot_id")
    search_help_text = "An error's exact reference, the context (method, route) or a process's boot id."
    ordering = ("-id",)
    fields = (
        "error_id",
        "occurred_at",
        "context",
        "exception_class",
        "first_line",
        "process_boot_id",
        "hostname",
        "pid",
    )
    readonly_fields = fields
