"""The node host: a paired machine's long-running connection to its gateway, offering to host workers.

    python -m openclaw_client.node --gateway ws://gateway:18789 --state-dir ~/.openclaw-node --capacity 4

It keeps its Ed25519 identity (and, once paired, its device token) in the state directory; asks
for pairing and waits until an operator approves it (``manage.py pairing approve <requestId>``);
stays connected, reconnecting with backoff, and closes a connection that stopped ticking; and after
every connect declares its worker host (``node.runnerInventory.update``: capacity, the captured
exec policy) — a declaration is scoped to the connection that made it. No Django here: this module
is part of the worker bundle the gateway ships to its hosts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .client import ClientOptions, ConnectError, GatewayClient, NodeCommandError

logger = logging.getLogger("openclaw.node")

WORKER_SUPERVISOR_FEATURE = "node-worker-supervisor-v6"
CAPACITY_MAX = 1024
DEFAULT_CAPACITY_WAIT_MS = 10_000


@dataclass(frozen=True)
class NodeHostConfig:
    gateway_url: str
    state_dir: Path
    capacity: int
    capacity_wait_ms: int = DEFAULT_CAPACITY_WAIT_MS
    token: str | None = None
    display_name: str | None = None


class NodeHost:
    def __init__(self, config: NodeHostConfig):
        self.config = config
        self.busy = 0
        options = ClientOptions(
            url=config.gateway_url,
            token=config.token,
            role="node",
            client_id="node-host",
            client_mode="node",
            display_name=config.display_name or os.uname().nodename,
            # The worker commands are declared as this host implements them.
            commands=[],
            caps=["worker-host"],
            state_dir=str(config.state_dir),
        )
        self.client = GatewayClient(options, invoke_handler=self._invoke)
        self._announced_request: str | None = None

    def inventory(self) -> dict[str, Any]:
        """The worker host this node offers, as ``node.runnerInventory.update`` takes it."""
        capacity = self.config.capacity
        return {
            "protocolFeatures": [WORKER_SUPERVISOR_FEATURE],
            "workerHost": {
                "enabled": True,
                "capacity": {"total": capacity, "available": max(0, capacity - self.busy)},
                "capturedExecPolicy": True,
            },
        }

    async def _on_connected(self, client: GatewayClient) -> None:
        self._announced_request = None
        accepted = await client.request("node.runnerInventory.update", self.inventory())
        logger.info(
            "connected to %s as node %s; hosting %d worker slot(s)",
            self.config.gateway_url,
            accepted.get("nodeId"),
            self.config.capacity,
        )

    async def _invoke(self, command: str, params: Any) -> Any:
        raise NodeCommandError("UNAVAILABLE", f"this node host does not implement {command}")

    def announce_pairing(self, error: ConnectError) -> None:
        """Say once per request how an operator approves this node."""
        request_id = (error.details or {}).get("requestId")
        if error.code == "NOT_PAIRED" and request_id and request_id != self._announced_request:
            self._announced_request = request_id
            print(
                f"waiting for pairing approval: request {request_id} "
                f"(on the gateway: manage.py pairing approve {request_id})",
                file=sys.stderr,
                flush=True,
            )

    async def run(self, stop: asyncio.Event) -> None:
        await self.client.run_forever(on_connected=self._on_connected, stop=stop, on_refused=self.announce_pairing)


def parse_args(argv: list[str] | None) -> NodeHostConfig:
    parser = argparse.ArgumentParser(prog="openclaw-node", description="Run a node host for an OpenClaw gateway.")
    parser.add_argument("--gateway", required=True, help="the gateway's WebSocket URL, e.g. ws://127.0.0.1:18789")
    parser.add_argument("--state-dir", required=True, help="where the node keeps its identity and device token")
    parser.add_argument("--capacity", type=int, default=os.cpu_count() or 1, help="worker slots (1-1024)")
    parser.add_argument(
        "--capacity-wait-ms", type=int, default=DEFAULT_CAPACITY_WAIT_MS, help="how long a launch waits for a free slot"
    )
    parser.add_argument("--token", default=None, help="the gateway's shared token (default: $OPENCLAW_GATEWAY_TOKEN)")
    parser.add_argument("--name", default=None, help="the name operators see (default: the host name)")
    args = parser.parse_args(argv)
    if not args.gateway.startswith(("ws://", "wss://")):
        parser.error("--gateway must be a ws:// or wss:// URL")
    if not 1 <= args.capacity <= CAPACITY_MAX:
        parser.error(f"--capacity must be between 1 and {CAPACITY_MAX}")
    if args.capacity_wait_ms < 0:
        parser.error("--capacity-wait-ms must not be negative")
    return NodeHostConfig(
        gateway_url=args.gateway,
        state_dir=Path(args.state_dir).expanduser(),
        capacity=args.capacity,
        capacity_wait_ms=args.capacity_wait_ms,
        token=args.token or os.environ.get("OPENCLAW_GATEWAY_TOKEN") or None,
        display_name=args.name,
    )


async def serve(config: NodeHostConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signum, stop.set)
    await NodeHost(config).run(stop)


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("OPENCLAW_LOG_LEVEL", "INFO"), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config.state_dir.mkdir(parents=True, exist_ok=True)
    try:
        asyncio.run(serve(config))
    except ConnectError as refused:
        print(f"error: {refused}", file=sys.stderr)
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
