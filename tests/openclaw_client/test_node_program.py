"""The node host program (``python -m openclaw_client.node``) in its own process, driven over a real WebSocket.

A small fake gateway plays the gateway's side of the wire: the handshake, ``node.runnerInventory.update``,
``node.invoke.request`` events for the worker commands, and answers to the node's ``node.event``
progress and ``node.invoke.result``. Its HTTP origin (bundle download, inference) is the same
``host:port`` as its WebSocket, as with the real gateway: a router in front sends WebSocket upgrades to
the fake gateway and everything else to the local HTTP server of ``test_worker``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import websockets

from openclaw_client.identity import IdentityStore
from openclaw_client.workspace import build_manifest, manifest_ref
from tests.openclaw_client.test_node_commands import DEVICE_TOKEN, real_bundle, sha
from tests.openclaw_client.test_worker import TOKEN, inference_server

ROOT = Path(__file__).resolve().parents[2]


class FakeGateway:
    """The gateway's side of one node connection: it invokes commands and collects what the node sends."""

    def __init__(self) -> None:
        self.connected = asyncio.Event()
        self.inventory: dict[str, Any] | None = None
        self.connect_params: dict[str, Any] | None = None
        self.frames: list[dict[str, Any]] = []  # every request the node sent after the handshake, in order
        self.results: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._socket: Any = None

    async def serve(self, socket: Any) -> None:
        self._socket = socket
        await socket.send(json.dumps({"type": "event", "event": "connect.challenge", "payload": {"nonce": "n-1"}}))
        async for raw in socket:
            frame = json.loads(raw)
            if frame.get("type") == "req":
                await self._answer(socket, frame)

    async def _answer(self, socket: Any, frame: dict[str, Any]) -> None:
        method, params = frame["method"], frame.get("params") or {}
        payload: dict[str, Any] = {}
        if method == "connect":
            self.connect_params = params
            payload = {"type": "hello-ok", "policy": {"tickIntervalMs": 60_000}}
        elif method == "node.runnerInventory.update":
            self.inventory = params
            payload = {"nodeId": "node-1"}
            self.connected.set()
        else:
            self.frames.append(frame)
        if method == "node.invoke.result":
            future = self.results.get(params["id"])
            if future is not None and not future.done():
                future.set_result(params)
        await socket.send(json.dumps({"type": "res", "id": frame["id"], "ok": True, "payload": payload}))

    async def invoke(self, command: str, params: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
        """Send ``node.invoke.request`` and wait for the node's ``node.invoke.result``."""
        invoke_id = str(uuid.uuid4())
        self.results[invoke_id] = asyncio.get_running_loop().create_future()
        request = {
            "id": invoke_id,
            "nodeId": "node-1",
            "command": command,
            "paramsJSON": json.dumps({"version": 1, **params}),
        }
        await self._socket.send(json.dumps({"type": "event", "event": "node.invoke.request", "payload": request}))
        return await asyncio.wait_for(self.results[invoke_id], timeout)

    def progress_of(self, invoke_id: str) -> list[dict[str, Any]]:
        return [
            frame["params"]["payload"]
            for frame in self.frames
            if frame["method"] == "node.event" and frame["params"]["payload"]["id"] == invoke_id
        ]


async def route(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ws_port: int, http_port: int) -> None:
    """One client connection: to the WebSocket server if it asks for an upgrade, else to the HTTP server."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        port = ws_port if b"upgrade: websocket" in head.lower() else http_port
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", port)
        upstream_writer.write(head)
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()


def worker_children(state_dir: Path) -> list[int]:
    """Live worker children whose working directory is under ``state_dir``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = (entry / "cmdline").read_bytes()
            if b"openclaw_client.worker" in cmdline and str(state_dir) in os.readlink(entry / "cwd"):
                found.append(int(entry.name))
    return found


def start_node_program(port: int, state_dir: Path, log_path: Path) -> subprocess.Popen:
    """The node host with one slot, its output in ``log_path``, none of this process's environment."""
    argv = [sys.executable, "-m", "openclaw_client.node", "--gateway", f"ws://127.0.0.1:{port}/ws"]
    argv += ["--state-dir", str(state_dir), "--capacity", "1", "--capacity-wait-ms", "200", "--name", "t"]
    environment = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        return subprocess.Popen(argv, cwd=ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT)


def test_the_node_program_runs_the_worker_commands_over_a_real_connection(tmp_path):
    state_dir = tmp_path / "state"
    IdentityStore(state_dir).save_device_token("node", DEVICE_TOKEN, [])
    bundle = real_bundle()
    source = tmp_path / "source"
    source.mkdir()
    (source / "notes.md").write_bytes(b"notes\n")
    manifest = build_manifest(source)
    log_path = tmp_path / "node.log"

    async def scenario(http_port: int) -> tuple[FakeGateway, dict[str, Any], int, list[int], str]:
        gateway = FakeGateway()
        ws_server = await websockets.serve(gateway.serve, "127.0.0.1", 0)
        ws_port = ws_server.sockets[0].getsockname()[1]
        router = await asyncio.start_server(lambda r, w: route(r, w, ws_port, http_port), "127.0.0.1", 0)
        port = router.sockets[0].getsockname()[1]
        node = await asyncio.to_thread(start_node_program, port, state_dir, log_path)
        try:
            await asyncio.wait_for(gateway.connected.wait(), 30)
            answers = await drive(gateway)
            children = worker_children(state_dir)
        finally:
            node.send_signal(signal.SIGTERM)
            exit_code = await asyncio.to_thread(node.wait, 30)
            router.close()
            ws_server.close()
        return gateway, answers, exit_code, children, log_path.read_text()

    async def drive(gateway: FakeGateway) -> dict[str, Any]:
        answers: dict[str, Any] = {}
        digest = sha(bundle)
        answers["install"] = await gateway.invoke(
            "worker.bundle.install.v1",
            {
                "bundleHash": digest,
                "openclawVersion": "test-1.0",
                "downloadPath": f"/api/workers/bundle/{digest}",
                "sizeBytes": len(bundle),
                "idempotencyKey": f"default:{digest}",
            },
        )
        blobs = {entry["sha256"]: base64.b64encode(b"notes\n").decode() for entry in manifest}
        answers["prepare"] = await gateway.invoke(
            "worker.workspace.prepare.v1",
            {
                "environmentId": "worker:env-1",
                "leaseId": "lease-1",
                "sessionId": "session-1",
                "manifestRef": manifest_ref(manifest),
                "manifest": manifest,
                "blobs": blobs,
            },
        )
        launch = {
            "environmentId": "worker:env-1",
            "leaseId": "lease-1",
            "sessionId": "session-1",
            "runId": "run-1",
            "bundleHash": digest,
            "model": "mock-model",
            "messages": [{"role": "user", "content": "hi"}],
            "inference": {"path": "/v1/paced", "token": TOKEN},
            "timeoutMs": 30_000,
        }
        answers["launch"] = await gateway.invoke("worker.launch.v1", launch)
        answers["status"] = await gateway.invoke("worker.status.v1", {})
        answers["unknown"] = await gateway.invoke("worker.desktop.stream.v1", {})
        return answers

    with inference_server() as server:
        server.files[f"/api/workers/bundle/{sha(bundle)}"] = bundle
        started = time.monotonic()
        gateway, answers, exit_code, children, log = asyncio.run(scenario(server.server.server_address[1]))

    assert exit_code == 0, log
    assert time.monotonic() - started < 60
    assert gateway.connect_params["role"] == "node"
    assert gateway.connect_params["commands"] == sorted(gateway.connect_params["commands"])
    assert "worker.launch.v1" in gateway.connect_params["commands"]
    assert gateway.inventory["workerHost"]["capacity"] == {"total": 1, "available": 1}

    def payload(answer: dict[str, Any]) -> dict[str, Any]:
        assert answer["ok"] is True, answer
        return json.loads(answer["payloadJSON"])

    assert payload(answers["install"])["installKind"] == "installed"
    assert server.gets == [f"/api/workers/bundle/{sha(bundle)}"]
    assert payload(answers["prepare"])["status"] == "ready"
    assert payload(answers["launch"])["text"] == "Hello"
    launch_id = answers["launch"]["id"]
    assert [item["seq"] for item in gateway.progress_of(launch_id)] == [1, 2]
    assert [item["data"]["text"] for item in gateway.progress_of(launch_id)] == ["Hel", "Hello"]
    methods = [frame["method"] for frame in gateway.frames]
    last_progress = max(index for index, frame in enumerate(gateway.frames) if frame["method"] == "node.event")
    launch_result = next(
        index
        for index, frame in enumerate(gateway.frames)
        if frame["method"] == "node.invoke.result" and frame["params"]["id"] == launch_id
    )
    assert last_progress < launch_result and methods.count("node.event") == 2
    assert payload(answers["status"])["capacity"] == {"total": 1, "available": 0, "reclaimableIdle": 1}
    assert answers["unknown"]["error"] == {
        "code": "UNAVAILABLE",
        "message": "this node host does not implement worker.desktop.stream.v1",
    }
    assert len(children) == 1  # the warm child, while the node ran
    assert worker_children(state_dir) == []  # stopped with the node
    assert log.count("invoke worker.bundle.install.v1 id=") == 1
    assert f"invoke worker.launch.v1 id={launch_id}" in log
