"""``gateway call``: one RPC against a gateway, printing the JSON result (like ``openclaw gateway call``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from .client import ClientOptions, ConnectError, GatewayClient, GatewayError

DEFAULT_SCOPES = ["operator.admin", "operator.read", "operator.write", "operator.approvals", "operator.pairing"]


async def call(
    *,
    url: str,
    method: str,
    params: Any,
    token: str | None,
    password: str | None = None,
    state_dir: str | None = None,
    timeout: float = 30.0,
    scopes: list[str] | None = None,
) -> tuple[bool, Any]:
    """Returns (ok, payload-or-error-shape)."""
    options = ClientOptions(
        url=url,
        token=token,
        password=password,
        scopes=scopes or list(DEFAULT_SCOPES),
        state_dir=state_dir,
        request_timeout=timeout,
    )
    client = GatewayClient(options)
    try:
        await client.connect()
    except ConnectError as error:
        return False, error.shape
    try:
        return True, await client.request(method, params, timeout=timeout)
    except GatewayError as error:
        return False, error.shape
    finally:
        await client.close()


def run_call(argv_namespace: argparse.Namespace, stdout=sys.stdout) -> int:
    try:
        params = json.loads(argv_namespace.params) if argv_namespace.params else {}
    except json.JSONDecodeError as exc:
        print(
            json.dumps({"ok": False, "error": {"code": "INVALID_REQUEST", "message": f"--params is not JSON: {exc}"}}),
            file=stdout,
        )
        return 2
    ok, result = asyncio.run(
        call(
            url=argv_namespace.url,
            method=argv_namespace.method,
            params=params,
            token=argv_namespace.token,
            password=getattr(argv_namespace, "password", None),
            state_dir=argv_namespace.state_dir,
            timeout=argv_namespace.timeout / 1000,
        )
    )
    if ok:
        print(json.dumps(result, indent=2, ensure_ascii=False), file=stdout)
        return 0
    print(json.dumps({"ok": False, "error": result}, indent=2, ensure_ascii=False), file=stdout)
    return 1


def add_call_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("method", help="Gateway method, e.g. health or node.list")
    parser.add_argument("--params", default="{}", help="JSON object of params")
    parser.add_argument("--url", default=None, help="Gateway WebSocket URL")
    parser.add_argument("--token", default=None, help="Shared gateway token")
    parser.add_argument("--password", default=None, help="Shared gateway password")
    parser.add_argument("--state-dir", default=None, help="Where this CLI keeps its device identity")
    parser.add_argument("--timeout", type=int, default=30_000, help="Timeout in ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="openclaw-gateway")
    sub = parser.add_subparsers(dest="command", required=True)
    add_call_arguments(sub.add_parser("call", help="Call one gateway method"))
    args = parser.parse_args(argv)
    if args.url is None:
        args.url = "ws://127.0.0.1:18789"
    return run_call(args)


if __name__ == "__main__":
    raise SystemExit(main())
