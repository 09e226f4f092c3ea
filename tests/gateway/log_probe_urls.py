"""A URL configuration for the access-log tests: a view that logs a line, one that fails, and the site's own."""

from __future__ import annotations

import logging

from django.http import HttpResponse
from django.urls import include, path

logger = logging.getLogger("openclaw.test.probe")


def logs_a_line(request):
    logger.info("inside the view")
    return HttpResponse("ok")


def fails(request):
    raise RuntimeError("the view failed")


urlpatterns = [
    path("probe/logs", logs_a_line),
    path("probe/fails", fails),
    path("", include("openclaw_site.urls")),
]
