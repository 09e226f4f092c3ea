"""What a browser gets from a running gateway: the admin's static files and the API docs, offline."""

from __future__ import annotations

import socket

import httpx
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_the_admin_css_and_javascript_are_served(gateway):
    css = httpx.get(f"{gateway.http_url}/static/admin/css/base.css")
    js = httpx.get(f"{gateway.http_url}/static/admin/js/actions.js")
    missing = httpx.get(f"{gateway.http_url}/static/admin/css/no-such-file.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert js.status_code == 200 and "javascript" in js.headers["content-type"]
    assert missing.status_code == 404


def test_the_api_docs_load_their_assets_from_the_gateway_not_a_cdn(gateway):
    page = httpx.get(f"{gateway.http_url}/api/docs")
    assert page.status_code == 200
    assert "cdn.jsdelivr" not in page.text and "unpkg" not in page.text
    assert "/static/ninja/swagger-ui-bundle.js" in page.text
    bundle = httpx.get(f"{gateway.http_url}/static/ninja/swagger-ui-bundle.js")
    assert bundle.status_code == 200 and len(bundle.content) > 100_000


def test_the_start_banner_names_the_model_provider(gateway):
    assert "model provider: built-in echo" in gateway.log()


def _exchange(gateway, data: bytes, *, give_up_s: float = 60) -> tuple[bytes, bool]:
    """Send raw bytes; return what comes back, and whether the server closed the connection
    (False: still open when this client gave up, far beyond the server's 10 s idle timeout)."""
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=give_up_s) as sock:
        sock.sendall(data)
        received = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                return received, True
            except TimeoutError:
                return received, False
            if not chunk:
                return received, True
            received += chunk


def test_an_overlong_request_line_gets_414_and_an_overlong_header_431(gateway):
    line, _ = _exchange(gateway, b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    header, _ = _exchange(gateway, b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 20_000 + b"\r\n\r\n")
    assert line.startswith(b"HTTP/1.1 414 URI Too Long\r\n")
    assert header.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")


def test_bytes_that_are_not_http_do_not_hold_the_socket(gateway):
    garbage, _ = _exchange(gateway, b"\x16\x03\x01 not http at all\r\n")
    stalled, closed = _exchange(gateway, b"\x00\x01\x02 no end of line")
    assert garbage.startswith(b"HTTP/1.1 400 Bad Request")
    assert (stalled, closed) == (b"", True)  # closed by the server's idle timeout
