"""The gateway's address and the console's System page.

``/`` over HTTP sends a browser to the console (its login first); the WebSocket at ``/`` never reaches Django
(``asgi.py`` routes it to the gateway). The System page is staff only, as the pairing page: it shows the
processes, the readiness checks (``/readyz``'s) and the recent internal errors with their references, whose
first line of message clients never see.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_safe

from operations_app import health
from operations_app import selectors as operations_selectors
from operations_app.services import ERRORS_KEPT


def staff_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Logged out: the login page. Logged in without staff status: 403, and nothing is read."""

    @login_required(login_url="ui:login")
    @wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not (request.user.is_active and request.user.is_staff):
            raise PermissionDenied("the system page is for staff users")
        return view(request, *args, **kwargs)

    return guarded


@require_safe
def root(request: HttpRequest) -> HttpResponse:
    return redirect("ui:sessions" if request.user.is_authenticated else "ui:login")


@require_GET
@staff_required
def system(request: HttpRequest) -> HttpResponse:
    readiness = health.readiness()
    return render(
        request,
        "operator_ui/system.html",
        {
            "nav": "system",
            "version": operations_selectors.server_version(),
            "processes": operations_selectors.gateway_processes(),
            "readiness": readiness,
            "checks": [(name, result) for name, result in readiness.checks.items()],
            "errors": operations_selectors.recent_errors(),
            "errors_kept": ERRORS_KEPT,
        },
    )
