"""What a browser gets from a running gateway: the admin's static files and the API docs, offline; and what a slow
or malformed HTTP client gets: 414/431 for overlong lines, 408 at the request head's deadline, 429 for an address
holding too many slow heads (docs/deployment.md, "Slow clients")."""

from __future__ import annotations

import asyncio
import select
import socket
import time

import httpx
import pytest

from tests.support.clients import operator
from tests.support.processes import start_gateway, stop_and_remove

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PARTIAL_HEAD = b"GET /api/gateway/health HTTP/1.1\r\nHost: gateway\r\nX-a: "
REQUEST_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\n"
TOO_MANY_REQUESTS = b"HTTP/1.1 429 Too Many Requests\r\n"
# The impatient gateway's head deadline; a head still incomplete after 1 s is slow, 2 per address are held.
HEAD_TIMEOUT_S = 4
SLOW_HEADS_PER_ADDRESS = 2
# How long a client here waits for an answer before giving up: far beyond the deadline and Twisted's 10 s idle
# timeout, so an answer within it is the deadline's doing.
GIVE_UP_S = 30


@pytest.fixture(scope="module")
def impatient_gateway(django_db_setup):
    server = start_gateway(
        worker=False,
        extra_env={
            "OPENCLAW_HTTP_HEAD_TIMEOUT_MS": str(HEAD_TIMEOUT_S * 1000),
            "OPENCLAW_HTTP_SLOW_HEADS_PER_ADDRESS": str(SLOW_HEADS_PER_ADDRESS),
        },
    )
    yield server
    stop_and_remove([server])


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
    assert "  model provider:  built-in echo" in gateway.log()


def _exchange(gateway, data: bytes, *, give_up_s: float = 60) -> tuple[bytes, bool]:
    """Send raw bytes; return what comes back, and whether the server closed the connection
    (False: still open when this client gave up, far beyond the server's 10 s head deadline)."""
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


def test_a_body_over_the_cap_gets_413_at_once_and_the_gateway_serves_on(gateway):
    """The cap is OPENCLAW_MAX_PAYLOAD_BYTES (25 MiB here): declared over it, a body is refused before it comes;
    sent chunked, once it passed it. Neither reaches a route, and the next request is served as usual."""
    declared, declared_closed = _exchange(
        gateway, b"POST /api/sessions/ HTTP/1.1\r\nHost: x\r\nContent-Length: 30000000000\r\n\r\n", give_up_s=20
    )
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=20) as sock:
        sock.sendall(b"POST /api/sessions/ HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        piece = b"%x\r\n%s\r\n" % (1 << 20, b"c" * (1 << 20))
        stopped = False
        try:
            for _ in range(60):  # 60 MiB: well past the 25 MiB cap
                sock.sendall(piece)
                if select.select([sock], [], [], 0)[0]:
                    break  # answered: the server stopped taking the body
        except (BrokenPipeError, ConnectionResetError):
            stopped = True  # refused and closed while this client was still sending
        chunked = _read_to_close(sock)

    assert declared.startswith(b"HTTP/1.1 413 Content Too Large\r\n") and declared_closed
    # The 413 is written before the close; a client still sending may see the close (a reset) first.
    assert chunked.startswith(b"HTTP/1.1 413 Content Too Large\r\n") or (stopped and chunked == b"")
    assert httpx.get(f"{gateway.http_url}/healthz", timeout=10).status_code == 200


def test_bytes_that_are_not_http_do_not_hold_the_socket(gateway):
    garbage, _ = _exchange(gateway, b"\x16\x03\x01 not http at all\r\n")
    stalled, closed = _exchange(gateway, b"\x00\x01\x02 no end of line")
    assert garbage.startswith(b"HTTP/1.1 400 Bad Request")
    assert stalled.startswith(REQUEST_TIMEOUT) and closed  # the head deadline: 10 s from accept


def _read_to_close(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (or this client gives up: then what came, with the socket open)."""
    received = b""
    sock.settimeout(GIVE_UP_S)
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            return received
        if not chunk:
            return received
        received += chunk


def _closed_first(socks: list[socket.socket], count: int) -> list[tuple[socket.socket, bytes]]:
    """The first ``count`` of ``socks`` that the server closes, with what it sent each, in the order they closed."""
    received = {sock: b"" for sock in socks}
    closed: list[tuple[socket.socket, bytes]] = []
    give_up = time.monotonic() + GIVE_UP_S
    while len(closed) < count and time.monotonic() < give_up:
        readable, _, _ = select.select([s for s in socks if s not in dict(closed)], [], [], 1)
        for sock in readable:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if chunk:
                received[sock] += chunk
            else:
                closed.append((sock, received[sock]))
    return closed


def _health(gateway, source: str) -> int:
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(transport=transport, timeout=GIVE_UP_S) as client:
        return client.get(f"{gateway.http_url}/api/gateway/health").status_code


def test_a_request_head_dribbled_a_byte_at_a_time_gets_408_at_its_deadline(impatient_gateway):
    with socket.create_connection(("127.0.0.1", impatient_gateway.port), timeout=GIVE_UP_S) as sock:
        sock.sendall(PARTIAL_HEAD)
        answer, sent, give_up = b"", 0, time.monotonic() + GIVE_UP_S
        # A byte every 0.2 s: each one restarts Twisted's idle timeout, which alone would never end this.
        while time.monotonic() < give_up:
            readable, _, _ = select.select([sock], [], [], 0.2)
            if readable:
                answer = _read_to_close(sock)
                break
            sock.sendall(b"a")
            sent += 1
    assert answer.startswith(REQUEST_TIMEOUT), answer
    assert sent > 0


def test_an_address_holding_too_many_slow_heads_is_refused_while_others_are_served(impatient_gateway):
    port = impatient_gateway.port
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(SLOW_HEADS_PER_ADDRESS + 2)]
    try:
        for sock in held:
            sock.sendall(PARTIAL_HEAD)
        # A second after accept the heads are slow: the two beyond the limit are answered at once.
        refused = _closed_first(held, 2)
        assert [answer[: len(TOO_MANY_REQUESTS)] for _sock, answer in refused] == [TOO_MANY_REQUESTS] * 2
        # While the others hold the limit: a new connection from the address is refused before it sends anything,
        # and another address (loopback has a whole /8) is served.
        with socket.create_connection(("127.0.0.1", port)) as probe:
            assert _read_to_close(probe).startswith(TOO_MANY_REQUESTS + b"Connection: close\r\nRetry-After: 4\r\n")
        assert _health(impatient_gateway, "127.0.0.2") == 200

        remaining = [sock for sock in held if sock not in dict(refused)]
        timed_out = [_read_to_close(sock) for sock in remaining]
        assert all(answer.startswith(REQUEST_TIMEOUT) for answer in timed_out), timed_out
    finally:
        for sock in held:
            sock.close()
    # Their deadline has freed the address.
    assert _health(impatient_gateway, "127.0.0.1") == 200


def test_a_websocket_stays_open_past_the_head_deadline(impatient_gateway):
    async def scenario():
        client = operator(impatient_gateway)
        await client.connect()
        try:
            await asyncio.sleep(HEAD_TIMEOUT_S + 1.5)
            return await client.request("health", {}, timeout=10)
        finally:
            await client.close()

    assert asyncio.run(scenario())["ok"] is True
