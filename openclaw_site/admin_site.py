"""The Django admin's site: the stock one, with failed logins rate limited like gateway auth.

Failed admin logins count per client address in the same cache-backed limiter the gateway uses
for shared-secret connects (``OPENCLAW_AUTH_RATE_LIMIT_*``, loopback exempt unless configured
otherwise); a locked-out address gets HTTP 429 with ``Retry-After`` until the lockout ends.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from django.contrib import admin
from django.contrib.admin.apps import AdminConfig
from django.http import HttpRequest, HttpResponse
from django.urls import reverse_lazy

from gateway.auth import AuthRateLimiter

admin_login_limiter = AuthRateLimiter("admin-login")


class GatewayAdminSite(admin.AdminSite):
    site_header = "OpenClaw gateway"
    site_title = "OpenClaw gateway admin"
    # "View site" opens the operators' console (``/`` is the gateway's socket and a redirect).
    site_url = reverse_lazy("ui:home")

    def login(self, request: HttpRequest, extra_context: dict | None = None) -> HttpResponse:
        return rate_limited_login(request, lambda: super(GatewayAdminSite, self).login(request, extra_context))


def rate_limited_login(request: HttpRequest, login: Callable[[], HttpResponse]) -> HttpResponse:
    """Run a login view with failed logins counted per address (the admin's and the console's together:
    one password guesser, one budget)."""
    address = request.META.get("REMOTE_ADDR")
    if request.method == "POST":
        state = admin_login_limiter.check(address)
        if state.locked:
            return _locked_out(state.retry_after_ms)
    response = login()
    if request.method == "POST":
        if request.user.is_authenticated and response.status_code in (301, 302):
            admin_login_limiter.reset(address)
        else:
            state = admin_login_limiter.record_failure(address)
            if state.locked:
                return _locked_out(state.retry_after_ms)
    return response


def _locked_out(retry_after_ms: int) -> HttpResponse:
    seconds = max(1, math.ceil(retry_after_ms / 1000))
    response = HttpResponse(
        f"Too many failed logins from this address; try again in {seconds} s.",
        status=429,
        content_type="text/plain; charset=utf-8",
    )
    response["Retry-After"] = str(seconds)
    return response


class GatewayAdminConfig(AdminConfig):
    default_site = "openclaw_site.admin_site.GatewayAdminSite"
