"""Who may open a console page or post its form: the scope the wire asks for the same work.

Each view names the gateway methods it does the work of (``operator_required("node.pair.approve", ...)``);
the scope comes from the method registry, so the console can never ask less than the wire. A page that no
method mirrors names its scope instead. The user's scopes come from their Django permissions
(``gateway/user_scopes.py``; docs/operator-console.md, "Who may do what").
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from gateway.user_scopes import missing_scope


def operator_required(*methods: str, scope: str | None = None) -> Callable[[Callable[..., HttpResponse]], Any]:
    """Logged out: the login page. Logged in without the scope of each of ``methods`` (or ``scope``): 403, and
    nothing is read or done."""
    if bool(methods) == (scope is not None):
        raise TypeError("name the gateway methods the view mirrors, or the scope of a page no method mirrors")

    def decorator(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @login_required(login_url="ui:login")
        @wraps(view)
        def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            lacking = missing_scope(request.user, methods, scope)
            if lacking is not None:
                return forbidden(request, f"this page needs {lacking}")
            return view(request, *args, **kwargs)

        return guarded

    return decorator


def forbidden(request: HttpRequest, reason: str) -> HttpResponse:
    """The console's 403: the styled page saying what the login lacks (``reason``, the console's own words, never an
    exception's text)."""
    return render(request, "403.html", {"reason": reason}, status=403)
