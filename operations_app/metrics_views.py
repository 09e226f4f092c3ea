"""``/metrics``: Prometheus' scrape endpoint (docs/operations.md, Metrics); the health probes are in ``views.py``.

Who may scrape: with ``OPENCLAW_METRICS_TOKEN`` set, whoever sends ``Authorization: Bearer <token>`` (loopback
clients too: one rule, and a proxy in front makes every client look local); without it, only a client on this
machine talking to the process directly (a loopback peer and no proxy headers — through HAProxy a client is
remote, as it is for the WebSocket). Everyone else gets 401 (a token is set and was not given or did not match)
or 403 (no token is set and the client is not local), with a message saying what to do.
"""

from __future__ import annotations

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.auth import is_loopback, secret_matches

from .metrics import scrape_registry

PROXY_HEADERS = ("HTTP_FORWARDED", "HTTP_X_REAL_IP")


def _direct_loopback(request: HttpRequest) -> bool:
    proxied = any(name in request.META for name in PROXY_HEADERS) or any(
        name.startswith("HTTP_X_FORWARDED_") for name in request.META
    )
    return not proxied and is_loopback(request.META.get("REMOTE_ADDR"))


def _bearer_token(request: HttpRequest) -> str | None:
    scheme, _space, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def _refusal(request: HttpRequest) -> HttpResponse | None:
    expected = settings.OPENCLAW_METRICS_TOKEN
    if expected:
        token = _bearer_token(request)
        if token is not None and secret_matches(token, expected):
            return None
        message = "metrics token missing" if token is None else "metrics token mismatch"
        response = HttpResponse(
            f"unauthorized: {message} (send Authorization: Bearer <OPENCLAW_METRICS_TOKEN>)\n",
            status=401,
            content_type="text/plain; charset=utf-8",
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    if _direct_loopback(request):
        return None
    return HttpResponse(
        "forbidden: /metrics answers loopback clients only; set OPENCLAW_METRICS_TOKEN to scrape it from elsewhere "
        "with Authorization: Bearer <token>\n",
        status=403,
        content_type="text/plain; charset=utf-8",
    )


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    if not settings.OPENCLAW_METRICS_ENABLED:
        raise Http404("metrics are disabled (OPENCLAW_METRICS_ENABLED=0)")
    refusal = _refusal(request)
    if refusal is not None:
        return refusal
    return HttpResponse(generate_latest(scrape_registry()), content_type=CONTENT_TYPE_LATEST)
