"""Call a gateway method in this process the way a connection's request does: the frame, the
authorization and params of ``dispatch.run_request``, the registered handler, and the response frame
a client receives (the seed's ``callGatewayHandler``)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from asgiref.sync import async_to_sync

from gateway import dispatch
from gateway import scopes as sc
from gateway.context import RpcContext
from gateway.protocol import RequestFrame
from gateway.registry import registry

_ids = itertools.count(1)


def operator_context() -> RpcContext:
    return RpcContext(
        conn_id="native-harness-test",
        channel_name="native-harness-test",
        role=sc.ROLE_OPERATOR,
        scopes=[sc.READ, sc.WRITE],
        auth_method="token",
        client_id="gateway-client",
        client_mode="backend",
    )


def call(method: str, params: dict[str, Any]) -> dict[str, Any]:
    """The response frame of one request: ``{"ok": True, "payload": …}`` or ``{"ok": False, "error": …}``."""
    frame = RequestFrame(type="req", id=f"req-{next(_ids)}", method=method, params=params)
    return async_to_sync(dispatch.run_request)(operator_context(), frame)


@contextmanager
def raised_by(*methods: str) -> Iterator[list[BaseException]]:
    """Record the exceptions leaving these methods' handlers (before the gateway maps them to a frame)."""
    seen: list[BaseException] = []
    originals = {name: registry.methods[name] for name in methods}

    def recording(handler):
        def handle(ctx, params):
            try:
                return handler(ctx, params)
            except BaseException as error:
                seen.append(error)
                raise

        return handle

    for name, spec in originals.items():
        assert not spec.is_async, name
        registry.methods[name] = dataclasses.replace(spec, handler=recording(spec.handler))
    try:
        yield seen
    finally:
        registry.methods.update(originals)
