"""The gateway's address and the console's System page.

``/`` over HTTP sends a browser to the console (its login first), ``/favicon.ico`` to the console's SVG icon
(browsers ask for it on every page without an icon link, the admin's and the API docs'); the WebSocket at ``/``
never reaches Django (``asgi.py`` routes it to the gateway). The System page is for logins holding
``operator.admin`` (no gateway method shows what it does): it shows the processes, the readiness checks
(``/readyz``'s) and the recent internal errors with their references, whose first line of message clients never
see.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect
from django.shortcuts import redirect, render
from django.templatetags.static import static
from django.views.decorators.http import require_GET, require_safe

from gateway import scopes
from operations_app import health
from operations_app import selectors as operations_selectors
from operations_app.services import ERRORS_KEPT

from .access import operator_required


@require_safe
def root(request: HttpRequest) -> HttpResponse:
    return redirect("ui:home" if request.user.is_authenticated else "ui:login")


@require_safe
def favicon(request: HttpRequest) -> HttpResponse:
    return HttpResponsePermanentRedirect(static("operator_ui/favicon.svg"))


@require_GET
@operator_required(scope=scopes.ADMIN)
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
