"""Node commands the gateway keeps to itself (workers.md §5.2).

The worker commands drive a node's worker host; only the gateway's own worker runtime sends them.
They are left out of every command list a client sees and ``node.invoke`` refuses them, whatever
the node declared or an operator approved.
"""

from __future__ import annotations

from collections.abc import Iterable

NODE_WORKER_PRIVATE_COMMANDS = frozenset(
    {
        "worker.bundle.install.v1",
        "worker.launch.v1",
        "worker.status.v1",
        "worker.cancel.v1",
        "worker.environment.stop.v1",
        "worker.workspace.exec.v1",
        # This gateway's workspace sync (docs/node-worker-protocol.md); OpenClaw's prepare command
        # has the same role.
        "worker.workspace.prepare.v1",
        "worker.workspace.export.v1",
        "worker.workspace.retain.v1",
        "worker.desktop.stream.v1",
        "worker.desktop.launch.v1",
        "worker.desktop.computer.v1",
        "worker.portal.stream.v1",
    }
)


def is_private_node_command(command: str) -> bool:
    return command in NODE_WORKER_PRIVATE_COMMANDS


def public_commands(commands: Iterable[str]) -> list[str]:
    """A command list as clients see it: sorted, unique, without the private commands."""
    return sorted({command for command in commands if command not in NODE_WORKER_PRIVATE_COMMANDS})
