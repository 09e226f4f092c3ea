"""Plain HTTP for load balancers and orchestrators: ``/healthz`` (liveness) and ``/readyz`` (readiness)."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from . import health


@never_cache
@require_safe
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse(health.liveness())


@never_cache
@require_safe
def readyz(request: HttpRequest) -> JsonResponse:
    readiness = health.readiness()
    return JsonResponse(readiness.to_json(), status=200 if readiness.ready else 503)
