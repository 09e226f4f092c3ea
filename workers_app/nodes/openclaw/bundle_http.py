"""``GET /__openclaw__/worker-bundle/v1/bundles/<bundleHash>``: OpenClaw's node host downloads this gateway's
worker bundle during ``worker.bundle.install.v1`` (node-worker-dialect.md §1.3, §3.3), as a plain ASGI app.

The one credential is the install's ``archive.token`` (``Authorization: Bearer``): minted for that bundle,
single use, revoked when the install ends. The route is served beside Django: no session, no CSRF, and no
wait behind the startup read gate (a node never waits on the gateway's recovery). Whatever is not a GET of
this gateway's current bundle with a current token of it is the same opaque ``404 {"error":"not_found"}``,
so a caller learns nothing about which part was wrong.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.http_auth import bearer_token

from .bundle import OpenClawBundle, openclaw_bundle
from .tokens import transfer_token_take

logger = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

BUNDLE_TRANSFER_PREFIX = "/__openclaw__/worker-bundle/v1/bundles/"
BUNDLE_TOKEN_PURPOSE = "worker-bundle"
TOKEN_PATTERN = re.compile(r"[A-Za-z0-9_-]{43}")
CHUNK_BYTES = 256 * 1024
NOT_FOUND = json.dumps({"error": "not_found"}).encode()


def bundle_transfer_path(bundle_hash: str) -> str:
    return f"{BUNDLE_TRANSFER_PREFIX}{bundle_hash}"


async def bundle_transfer_app(scope: Scope, receive: Receive, send: Send) -> None:
    bundle = await asyncio.to_thread(openclaw_bundle)  # built on the first call of the process
    if not await _authorized(scope, bundle):
        await _not_found(send)
        return
    try:
        handle = await asyncio.to_thread(bundle.path.open, "rb")
    except OSError:
        logger.error("OpenClaw worker bundle %s is gone from the state dir", bundle.tarball_sha256)
        await _not_found(send)
        return
    try:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/gzip"),
                    (b"content-length", str(bundle.tarball_bytes).encode()),
                    (b"x-openclaw-content-sha256", bundle.tarball_sha256.encode()),
                    (b"cache-control", b"no-store"),
                ],
            }
        )
        remaining = bundle.tarball_bytes
        while remaining > 0:
            chunk = await asyncio.to_thread(handle.read, min(CHUNK_BYTES, remaining))
            if not chunk:
                # Shorter than its recorded size: end the response short; the node's size check refuses it.
                logger.error("OpenClaw worker bundle %s is shorter than built", bundle.tarball_sha256)
                break
            remaining -= len(chunk)
            await send({"type": "http.response.body", "body": chunk, "more_body": remaining > 0})
        if remaining > 0:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        else:
            # One line per bundle a node downloaded: an operator sees installs (and reinstalls after a loss).
            logger.info(
                "worker bundle %s sent to a node's install (%d bytes)", bundle.bundle_hash, bundle.tarball_bytes
            )
    finally:
        handle.close()


async def _authorized(scope: Scope, bundle: OpenClawBundle) -> bool:
    """A GET of the current bundle with a current token of it (the token is consumed: single use)."""
    if scope.get("method") != "GET" or scope["path"] != bundle_transfer_path(bundle.bundle_hash):
        return False
    token = bearer_token(scope)
    if token is None or not TOKEN_PATTERN.fullmatch(token):
        return False
    return await asyncio.to_thread(transfer_token_take, token, BUNDLE_TOKEN_PURPOSE, bundle.bundle_hash)


async def _not_found(send: Send) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 404,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(NOT_FOUND)).encode()),
                (b"cache-control", b"no-store"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": NOT_FOUND})
