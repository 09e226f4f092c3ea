"""The console's Logs page: the newest lines of the gateway's log file, a level filter, and live follow.

For logins holding ``operator.read``, as ``logs.tail`` asks on the wire. The page is complete without JavaScript
(the filter is a GET form, the lines are rendered on the server); with it, ``logs.js`` asks ``logs/tail`` every
few seconds for the lines after the page's cursor, as ``logs.tail`` answers them, filtered the same way.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from gateway.exceptions import GatewayError
from operations_app import logs

from .access import operator_required

LINE_COUNTS = (100, 500, 1000)
DEFAULT_LINE_COUNT = 500
# A follow request reads at most this much: a page that fell further behind starts again from the newest lines.
FOLLOW_MAX_BYTES = 250_000
FOLLOW_INTERVAL_MS = 3000


def _level(request: HttpRequest) -> str:
    level = request.GET.get("level", "").upper()
    return level if level in logs.LEVELS else ""


def _line_count(request: HttpRequest) -> int:
    try:
        count = int(request.GET.get("lines", DEFAULT_LINE_COUNT))
    except ValueError:
        return DEFAULT_LINE_COUNT
    return count if count in LINE_COUNTS else DEFAULT_LINE_COUNT


def _entry_payload(entry: logs.LogEntry) -> dict[str, str]:
    return {
        "time": entry.time,
        "level": entry.level,
        "logger": entry.logger,
        "process": entry.process,
        "message": entry.message,
        "context": entry.context,
    }


@require_GET
@operator_required("logs.tail")
def logs_page(request: HttpRequest) -> HttpResponse:
    level, count = _level(request), _line_count(request)
    context = {"nav": "logs", "level": level, "levels": logs.LEVELS, "lines": count, "line_counts": LINE_COUNTS}
    try:
        path = logs.log_file()
        # The widest window, filtered, then the newest lines of it: a rare level still fills the page.
        tail = logs.log_tail(path, limit=logs.MAX_LIMIT, max_bytes=logs.MAX_BYTES)
    except GatewayError as unavailable:
        return render(request, "operator_ui/logs.html", {**context, "unavailable": unavailable.message})
    entries = [entry for entry in map(logs.parse_line, tail.lines) if logs.at_least(entry, level)][-count:]
    return render(
        request,
        "operator_ui/logs.html",
        {
            **context,
            "file": tail.file,
            "entries": entries,
            "cursor": tail.cursor,
            "follow_interval_ms": FOLLOW_INTERVAL_MS,
        },
    )


@require_GET
@operator_required("logs.tail")
def logs_follow(request: HttpRequest) -> JsonResponse:
    """The lines after ``cursor`` (a byte offset from the page or the previous answer), filtered by ``level``."""
    try:
        cursor = int(request.GET["cursor"])
    except (KeyError, ValueError):
        return JsonResponse({"error": "cursor must be a whole number"}, status=400)
    if cursor < 0:
        return JsonResponse({"error": "cursor must be a whole number"}, status=400)
    level = _level(request)
    try:
        tail = logs.log_tail(logs.log_file(), cursor=cursor, limit=logs.MAX_LIMIT, max_bytes=FOLLOW_MAX_BYTES)
    except GatewayError as unavailable:
        return JsonResponse({"error": unavailable.message}, status=503)
    entries = [entry for entry in map(logs.parse_line, tail.lines) if logs.at_least(entry, level)]
    return JsonResponse(
        {"cursor": tail.cursor, "reset": tail.reset, "entries": [_entry_payload(entry) for entry in entries]}
    )
