"""The console socket's origin check: its own origin or one Django's CSRF check trusts, nothing else."""

from __future__ import annotations

import pytest

from operator_ui.origins import same_origin


def scope(origin: str | None, host: str | None = "console.example:8443") -> dict:
    headers = []
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    if host is not None:
        headers.append((b"host", host.encode()))
    return {"type": "websocket", "headers": headers}


@pytest.mark.parametrize(
    ("origin", "host", "allowed"),
    [
        ("https://console.example:8443", "console.example:8443", True),
        ("http://CONSOLE.example:8443", "console.example:8443", True),
        ("https://console.example", "console.example:8443", False),  # another port is another origin
        ("https://evil.example", "console.example:8443", False),
        ("null", "console.example:8443", False),  # sandboxed frames, file:// pages
        ("ftp://console.example:8443", "console.example:8443", False),
        (None, "console.example:8443", False),
        ("https://console.example:8443", None, False),
    ],
)
def test_only_the_consoles_own_origin_may_open_its_socket(origin, host, allowed):
    assert same_origin(scope(origin, host)) is allowed


def test_an_origin_django_trusts_for_csrf_may_open_it_too(settings):
    settings.CSRF_TRUSTED_ORIGINS = ["https://proxy.example"]

    assert same_origin(scope("https://proxy.example", "gateway.internal:18789"))
    assert not same_origin(scope("https://other.example", "gateway.internal:18789"))
