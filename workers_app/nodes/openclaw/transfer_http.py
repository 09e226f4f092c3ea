"""``/__openclaw__/worker-transfer/v1/…``: the routes OpenClaw's node host pulls a workspace from and pushes
its changes to (OpenClaw's ``node-workspace-transfer-http``), as a plain ASGI app beside Django (transport only;
the rules are :mod:`.workspace`'s). They do not wait behind the startup read gate: a sync or a move that is
under way when the gateway restarts is what recovery fails, not what it waits for.

    GET  environments/<envId>/snapshots/<64 hex>/manifest   the download's manifest v1 (gzip when accepted)
    GET  environments/<envId>/blobs/<sha256>                 a file of that manifest, verified against its digest
    POST environments/<envId>/reconciliations/<64 hex>       the binary reconcile upload → ``{"manifestRef"}``

Each needs ``Authorization: Bearer <the operation's token>``. Anything else — a wrong path or method, a query,
a missing, foreign or spent token, a file not in the operation's manifest or no longer the one listed — is the
same opaque ``404 {"error":"not_found"}``. A refused upload is ``413 {"error":"workspace_transfer_limit"}`` or
``400 {"error":"workspace_transfer_invalid","reason":…}``, the shapes OpenClaw's node maps to its own errors.
Every answer carries ``Cache-Control: no-store``. (No ``…/pack`` route: this gateway never sends a Git base.)
"""

from __future__ import annotations

import gzip
import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from asgiref.sync import async_to_sync
from channels.db import DatabaseSyncToAsync

from . import workspace
from .upload import TransferInvalid, TransferTooLarge

logger = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

TRANSFER_PATH = "/__openclaw__/worker-transfer/v1"
MAX_ENVIRONMENT_ID_CHARS = 256
_HEX_DIGEST = re.compile(r"[a-f0-9]{64}")
NOT_FOUND = json.dumps({"error": "not_found"}).encode()
NO_STORE = (b"cache-control", b"no-store")
JSON_TYPE = (b"content-type", b"application/json; charset=utf-8")


class ClientGone(Exception):
    """The node hung up before its upload was read."""


@dataclass(frozen=True)
class Route:
    kind: str  # manifest | blob | reconcile
    environment_id: str
    digest: str  # the manifest's hex, the blob's sha256, or the reconcile's base hex


def _environment_id(segment: str) -> str | None:
    try:
        value = unquote(segment, errors="strict")
    except UnicodeDecodeError:
        return None
    if not value or len(value) > MAX_ENVIRONMENT_ID_CHARS or any(c in value for c in "/\\\x00"):
        return None
    return value


def parse_route(scope: Scope) -> Route | None:
    """The route a request names (OpenClaw's ``parseNodeWorkspaceTransferHttpRoute``), or None."""
    raw_path = scope.get("raw_path")
    path = raw_path.decode("latin-1") if isinstance(raw_path, bytes) else scope["path"]
    if not path.startswith(TRANSFER_PATH + "/") or scope.get("query_string"):
        return None
    segments = path[len(TRANSFER_PATH) + 1 :].split("/")
    if len(segments) < 4 or segments[0] != "environments":
        return None
    environment_id = _environment_id(segments[1])
    method = scope["method"]
    if environment_id is None or not _HEX_DIGEST.fullmatch(segments[3]):
        return None
    if method == "GET" and len(segments) == 5 and segments[2] == "snapshots" and segments[4] == "manifest":
        return Route("manifest", environment_id, segments[3])
    if method == "GET" and len(segments) == 4 and segments[2] == "blobs":
        return Route("blob", environment_id, segments[3])
    if method == "POST" and len(segments) == 4 and segments[2] == "reconciliations":
        return Route("reconcile", environment_id, segments[3])
    return None


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _bearer(scope: Scope) -> str | None:
    scheme, _, token = (_header(scope, b"authorization") or "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def manifest_encoding(accept_encoding: str | None) -> str | None:
    """``gzip`` or ``identity`` as OpenClaw's ``resolveHttpContentEncodings`` picks it for the manifest; None
    when the client accepts neither (406)."""
    if not accept_encoding or not accept_encoding.strip():
        return "identity"
    qualities: dict[str, float] = {}
    for item in accept_encoding.split(","):
        name, *params = item.split(";")
        name = name.strip().lower()
        if not name:
            continue
        quality = 1.0
        for param in params:
            key, _, value = param.strip().partition("=")
            if key.lower() == "q":
                valid = re.fullmatch(r"0(\.\d{0,3})?|1(\.0{0,3})?", value.strip())
                quality = float(value) if valid else 0.0
        qualities[name] = max(qualities.get(name, 0.0), quality)
    wildcard = qualities.get("*")
    gzip_quality = qualities.get("gzip", wildcard or 0.0)
    identity_quality = qualities.get("identity", 0.0 if wildcard == 0 else 1.0)
    ranked = sorted(
        (name for name, quality in (("gzip", gzip_quality), ("identity", identity_quality)) if quality > 0),
        key=lambda name: -(gzip_quality if name == "gzip" else identity_quality),
    )
    return ranked[0] if ranked else None


async def _answer(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    all_headers = [NO_STORE, (b"content-length", str(len(body)).encode()), *(headers or [])]
    if body and not any(name == b"content-type" for name, _ in all_headers):
        all_headers.append(JSON_TYPE)
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _not_found(send: Send) -> None:
    await _answer(send, 404, NOT_FOUND)


def _in_thread[**P, T](fn: Callable[P, T]) -> Callable[P, Awaitable[T]]:
    # Not the shared sync thread: a transfer reads or hashes files for a while.
    return DatabaseSyncToAsync(fn, thread_sensitive=False)


async def transfer_app(scope: Scope, receive: Receive, send: Send) -> None:
    route = parse_route(scope)
    token = _bearer(scope)
    if route is None or token is None:
        await _not_found(send)
        return
    direction = workspace.UPLOAD if route.kind == "reconcile" else workspace.DOWNLOAD
    named_manifest = route.digest if route.kind != "blob" else None
    authorized = await _in_thread(workspace.authorize)(token, route.environment_id, direction, named_manifest)
    if authorized is None:
        await _not_found(send)
        return
    try:
        if route.kind == "manifest":
            await _send_manifest(scope, send, authorized)
        elif route.kind == "blob":
            await _send_blob(send, authorized, route.digest)
        else:
            await _receive_reconcile(scope, receive, send, authorized)
    except ClientGone:
        return
    except Exception:
        # A bug, or the worktree failing under the read: the node's transfer fails (the log says why).
        logger.exception("workspace transfer %s of environment %s failed", route.kind, route.environment_id)
        raise


async def _send_manifest(scope: Scope, send: Send, authorized: workspace.Authorized) -> None:
    raw = await _in_thread(workspace.served_manifest)(authorized)
    if raw is None:
        await _not_found(send)
        return
    encoding = manifest_encoding(_header(scope, b"accept-encoding"))
    vary = (b"vary", b"Accept-Encoding")
    if encoding is None:
        await _answer(send, 406, b"", [vary])
        return
    headers = [JSON_TYPE, vary]
    if encoding == "gzip":
        raw = await _in_thread(gzip.compress)(raw, 1)
        headers.append((b"content-encoding", b"gzip"))
    await _answer(send, 200, raw, headers)


async def _send_blob(send: Send, authorized: workspace.Authorized, digest: str) -> None:
    blob = await _in_thread(workspace.open_blob)(authorized, digest)
    if blob is None:
        await _not_found(send)
        return
    chunks = workspace.blob_chunks(blob, digest, authorized)
    size = str(blob.size).encode()
    headers = [NO_STORE, (b"content-type", b"application/octet-stream"), (b"content-length", size)]
    next_chunk = _in_thread(lambda: next(chunks, b""))
    try:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        while chunk := await next_chunk():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    finally:
        await _in_thread(chunks.close)()
        # A generator closed before its first chunk never entered its ``with``: the file is closed here too.
        blob.handle.close()
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _receive_reconcile(scope: Scope, receive: Receive, send: Send, authorized: workspace.Authorized) -> None:
    length = _header(scope, b"content-length")
    content_length = int(length) if length is not None and length.isascii() and length.isdigit() else None

    body_ended = False

    async def next_chunk() -> bytes:
        nonlocal body_ended
        while not body_ended:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            body_ended = not message.get("more_body")
            if chunk := message.get("body", b""):
                return chunk
        return b""

    def receive_in_thread() -> dict:
        return workspace.receive_reconcile(
            authorized,
            async_to_sync(next_chunk),
            content_type=_header(scope, b"content-type"),
            content_length=content_length,
        )

    try:
        answer = await _in_thread(receive_in_thread)()
    except TransferTooLarge:
        await _answer(send, 413, json.dumps({"error": "workspace_transfer_limit"}).encode())
        return
    except TransferInvalid as refused:
        body = json.dumps({"error": "workspace_transfer_invalid", "reason": refused.reason}).encode()
        await _answer(send, 400, body)
        return
    await _answer(send, 200, json.dumps(answer).encode(), [JSON_TYPE])
