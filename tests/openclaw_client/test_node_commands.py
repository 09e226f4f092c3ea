"""The node host's private worker commands, called directly on a :class:`NodeHost` (no gateway).

A local HTTP server stands in for the gateway's origin: it serves bundles to the node's device token
and answers inference as server-sent events. Worker children are real processes started from
bundles installed in the node's state directory.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from openclaw_client import node as node_module
from openclaw_client.client import ConnectError, InvokeContext, NodeCommandError, current_invoke
from openclaw_client.identity import IdentityStore
from openclaw_client.node import (
    BUNDLE_MANIFEST_NAME,
    NODE_HOST_COMMANDS,
    PROGRESS_COALESCE_S,
    BundleInstallError,
    CoalescedDeltas,
    Journal,
    NodeHost,
    NodeHostConfig,
    gateway_http_origin,
)
from openclaw_client.workspace import build_manifest, manifest_ref
from tests.openclaw_client.test_worker import TOKEN, inference_server
from workers_app.nodes.inventory import parse_declaration

ROOT = Path(__file__).resolve().parents[2]
DEVICE_TOKEN = "device-token"
FAKE_WORKER = b"""import json, os, sys
for line in sys.stdin:
    job = json.loads(line)
    if job["type"] != "turn":
        continue
    if job["messages"][-1]["content"] == "die":
        sys.exit(3)
    report = {"file": __file__, "env": sorted(os.environ), "cwd": os.getcwd()}
    done = {"type": "done", "runId": job["runId"], "status": "ok", "text": json.dumps(report), "stopReason": "stop"}
    print(json.dumps(done), flush=True)
"""


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- bundles --------------------------------------------------------------------------------------


def archive(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    """A .tar.gz of ``members``; the same members always give the same bytes (no time in the gzip header)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return gzip.compress(buffer.getvalue(), mtime=0)


def regular(name: str, data: bytes, mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.mode = mode
    return info, data


def bundle(files: dict[str, bytes], version: str = "test-1.0") -> bytes:
    manifest = json.dumps({"name": "openclaw-worker", "version": version, "files": sorted(files)}).encode()
    return archive([regular(BUNDLE_MANIFEST_NAME, manifest), *(regular(name, data) for name, data in files.items())])


def real_bundle(version: str = "test-1.0") -> bytes:
    """The worker bundle of this checkout's ``openclaw_client`` (as the gateway builds it)."""
    sources = {
        path.relative_to(ROOT).as_posix(): path.read_bytes()
        for path in sorted((ROOT / "openclaw_client").rglob("*.py"))
    }
    return bundle(sources, version)


def fake_bundle() -> bytes:
    """A bundle whose worker reports where it runs from and with what environment."""
    return bundle({"openclaw_client/__init__.py": b"", "openclaw_client/worker.py": FAKE_WORKER}, "fake-1")


# --- the host under test --------------------------------------------------------------------------


@pytest.fixture
def server():
    with inference_server() as running:
        yield running


def host_for(state: Path, server, *, capacity: int = 1, wait_ms: int = 200, **config: Any) -> NodeHost:
    IdentityStore(state).save_device_token("node", DEVICE_TOKEN, [])
    port = server.server.server_address[1]
    return NodeHost(
        NodeHostConfig(
            gateway_url=f"ws://127.0.0.1:{port}/ws",
            state_dir=state,
            capacity=capacity,
            capacity_wait_ms=wait_ms,
            **config,
        )
    )


def run(tmp_path: Path, server, scenario: Callable[[NodeHost], Awaitable[Any]], **config: Any) -> Any:
    async def main() -> Any:
        host = host_for(tmp_path / "state", server, **config)
        try:
            return await scenario(host)
        finally:
            await host.shutdown()

    return asyncio.run(main())


async def call(host: NodeHost, command: str, **params: Any) -> dict[str, Any]:
    return await host.handle(command, {"version": 1, **params})


async def refused(host: NodeHost, command: str, **params: Any) -> NodeCommandError:
    with pytest.raises(NodeCommandError) as raised:
        await call(host, command, **params)
    return raised.value


def install_local(host: NodeHost, data: bytes) -> str:
    """Install bundle bytes straight from a file (no download)."""
    digest = sha(data)
    path = host.config.state_dir / "upload.tar.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    host.bundles.install_archive(path, digest)
    path.unlink()
    return digest


def prepare_local(host: NodeHost, environment_id: str, files: dict[str, bytes], lease: str = "lease-1") -> str:
    """A workspace materialized directly (its blobs stored, its record written) for launch tests."""
    source = host.config.state_dir.parent / f"source-{environment_id}"
    for name, data in files.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(data)
    manifest = build_manifest(source)
    blobs = {entry["sha256"]: base64.b64encode((source / entry["path"]).read_bytes()).decode() for entry in manifest}
    ref = manifest_ref(manifest)
    answer = host._prepare(environment_id, lease, "session-1", ref, manifest, blobs)
    assert answer["status"] == "ready"
    return ref


class Progress:
    """An :class:`InvokeContext` for direct calls: what a handler reports is recorded, in order."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send(self, payload: dict[str, Any]) -> None:
        self.sent.append(payload)

    def install(self) -> None:
        current_invoke.set(InvokeContext("invoke-1", "node-1", self.send))


def launch_params(server, environment_id: str, bundle_hash: str, content: str = "hi", **extra: Any) -> dict:
    return {
        "environmentId": environment_id,
        "leaseId": "lease-1",
        "sessionId": "session-1",
        "runId": extra.pop("runId", "run-1"),
        "bundleHash": bundle_hash,
        "model": "mock-model",
        "messages": [{"role": "user", "content": content}],
        "inference": {"path": extra.pop("path", "/v1/ok"), "token": TOKEN},
        "timeoutMs": 30_000,
        **extra,
    }


# --- commands, params, inventory ------------------------------------------------------------------


def test_the_node_declares_every_worker_command_and_an_inventory_the_gateway_accepts(tmp_path, server):
    async def scenario(host: NodeHost):
        return host.client.options.commands, host.inventory()

    commands, inventory = run(tmp_path, server, scenario, capacity=3)
    assert commands == list(NODE_HOST_COMMANDS) and len(commands) == 9
    assert inventory == {
        "protocolFeatures": ["node-worker-supervisor-v6"],
        "workerHost": {
            "enabled": True,
            "capacity": {"total": 3, "available": 3},
            "bundlePrewarm": 1,
            "bundleRetention": 1,
            "bundleStatus": 1,
            "capturedExecPolicy": True,
        },
    }
    assert parse_declaration(inventory).hosting


def test_unknown_commands_versions_and_bad_params_are_refused_with_their_codes(tmp_path, server):
    async def scenario(host: NodeHost):
        with pytest.raises(NodeCommandError) as unknown:
            await host.handle("worker.desktop.stream.v1", {"version": 1})
        with pytest.raises(NodeCommandError) as no_params:
            await host.handle("worker.status.v1", None)
        with pytest.raises(NodeCommandError) as no_version:
            await host.handle("worker.status.v1", {})
        newer = await refused(host, "worker.status.v1", version=2)
        bad_hash = await refused(
            host,
            "worker.bundle.install.v1",
            bundleHash="../../etc",
            openclawVersion="1",
            downloadPath="/x",
            sizeBytes=1,
            idempotencyKey="k",
        )
        bad_environment = await refused(host, "worker.workspace.export.v1", environmentId="../up", baseManifestRef="x")
        return unknown.value, no_params.value, no_version.value, newer, bad_hash, bad_environment

    unknown, no_params, no_version, newer, bad_hash, bad_environment = run(tmp_path, server, scenario)
    assert (unknown.code, unknown.message) == (
        "UNAVAILABLE",
        "this node host does not implement worker.desktop.stream.v1",
    )
    assert (no_params.code, no_params.message) == ("INVALID_REQUEST", "worker.status.v1: params must be an object")
    assert (no_version.code, no_version.message) == ("INVALID_REQUEST", "worker.status.v1: version must be 1")
    assert (newer.code, newer.message) == (
        "UNSUPPORTED_VERSION",
        "worker.status.v1 version 2 is not supported (this node speaks version 1)",
    )
    assert (bad_hash.code, bad_hash.message) == (
        "INVALID_REQUEST",
        "worker.bundle.install.v1: bundleHash must be a sha256 of 64 lowercase hex digits",
    )
    assert bad_environment.code == "INVALID_REQUEST" and "environmentId must be an environment id" in (
        bad_environment.message
    )


def test_the_gateway_origin_comes_from_the_websocket_url():
    assert gateway_http_origin("ws://127.0.0.1:18789") == "http://127.0.0.1:18789"
    assert gateway_http_origin("wss://gw.example.com/ws?x=1") == "https://gw.example.com"
    with pytest.raises(ValueError):
        gateway_http_origin("http://gw")


# --- worker.bundle.install.v1 ---------------------------------------------------------------------


def install_params(data: bytes, **overrides: Any) -> dict[str, Any]:
    digest = sha(data)
    return {
        "bundleHash": digest,
        "openclawVersion": "test-1.0",
        "downloadPath": f"/api/workers/bundle/{digest}",
        "sizeBytes": len(data),
        "idempotencyKey": f"default:{digest}",
        **overrides,
    }


def test_a_bundle_is_downloaded_with_the_device_token_checked_and_installed_once(tmp_path, server):
    data = real_bundle()
    server.files[f"/api/workers/bundle/{sha(data)}"] = data

    async def scenario(host: NodeHost):
        first = await call(host, "worker.bundle.install.v1", **install_params(data))
        again = await call(host, "worker.bundle.install.v1", **install_params(data))
        return first, again, host.bundles.directory(sha(data))

    first, again, directory = run(tmp_path, server, scenario)
    assert first == {
        "bundleHash": sha(data),
        "openclawVersion": "test-1.0",
        "protocolFeatures": ["node-worker-supervisor-v6"],
        "installKind": "installed",
    }
    assert again["installKind"] == "existing"
    assert server.gets == [f"/api/workers/bundle/{sha(data)}"]
    assert (directory / "openclaw_client/worker.py").read_bytes() == (ROOT / "openclaw_client/worker.py").read_bytes()
    assert not [entry for entry in directory.parent.iterdir() if entry.name.startswith(".")]  # nothing staged left


def test_concurrent_installs_of_one_bundle_share_one_transfer(tmp_path, server):
    data = real_bundle()
    server.files[f"/api/workers/bundle/{sha(data)}"] = data
    server.get_delay = 0.3

    async def scenario(host: NodeHost):
        ticks = 0

        async def ticking() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.02)
                ticks += 1

        ticker = asyncio.create_task(ticking())
        receipts = await asyncio.gather(
            *(call(host, "worker.bundle.install.v1", **install_params(data)) for _ in range(3))
        )
        ticker.cancel()
        return receipts, ticks

    receipts, ticks = run(tmp_path, server, scenario)
    assert [receipt["installKind"] for receipt in receipts] == ["installed"] * 3
    assert len(server.gets) == 1
    assert ticks >= 5  # the event loop kept running while the download was under way


def test_a_prewarm_install_leaves_a_warm_child_that_the_first_turn_uses(tmp_path, server):
    data = real_bundle()
    server.files[f"/api/workers/bundle/{sha(data)}"] = data

    async def scenario(host: NodeHost):
        await call(host, "worker.bundle.install.v1", **install_params(data, bundlePrewarm=1))
        warm = host.pool._idle[0].child.process.pid
        capacity = host.pool.capacity()
        prepare_local(host, "env-1", {"a.txt": b"a"})
        result = await call(host, "worker.launch.v1", **launch_params(server, "env-1", sha(data)))
        return capacity, result, host.pool._idle[0].child.process.pid == warm

    capacity, result, reused = run(tmp_path, server, scenario)
    assert capacity == {"total": 1, "available": 0, "reclaimableIdle": 1}
    assert result["text"] == "Hello" and reused


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("wrong-token", "worker bundle installation failed: the gateway answered HTTP 401"),
        ("not-served", "worker bundle installation failed: the gateway answered HTTP 404"),
        ("other-bytes", "worker bundle installation failed: the download does not match the bundle's sha256"),
        ("too-large", "worker bundle installation failed: the download is larger than 100 bytes"),
        ("short", "worker bundle installation failed: the download was"),
        ("no-token", "worker bundle installation failed: this node has no device token yet"),
        ("unsafe", "worker bundle installation failed: bundle member '../evil.py' is unsafe"),
    ],
)
def test_a_failed_install_says_why_without_a_host_path_and_leaves_nothing(tmp_path, server, setup, message):
    data = real_bundle()
    params = install_params(data)
    path = params["downloadPath"]
    server.files[path] = data
    if setup == "wrong-token":
        server.file_token = "another-token"
    elif setup == "not-served":
        del server.files[path]
    elif setup == "other-bytes":
        server.files[path] = bytes(reversed(data))
    elif setup == "too-large":
        params["sizeBytes"] = 100
    elif setup == "short":
        params["sizeBytes"] = len(data) + 10
    elif setup == "unsafe":
        evil = archive([regular("../evil.py", b"boom")])
        server.files[path] = evil
        params = install_params(evil, downloadPath=path)

    async def scenario(host: NodeHost):
        if setup == "no-token":
            IdentityStore(host.config.state_dir).forget_device_token("node")
        failure = await refused(host, "worker.bundle.install.v1", **params)
        return failure, host.bundles

    failure, bundles = run(tmp_path, server, scenario)
    assert failure.code == "BUNDLE_INSTALL_FAILED"
    assert failure.message.startswith(message)
    assert str(tmp_path) not in failure.message
    assert bundles.hashes() == [] and not (tmp_path / "evil.py").exists()
    assert not bundles.root.exists() or not list(bundles.root.iterdir())


def unsafe_members() -> dict[str, list[tuple[tarfile.TarInfo, bytes | None]]]:
    manifest = regular(BUNDLE_MANIFEST_NAME, json.dumps({"version": "1"}).encode())
    worker = regular("openclaw_client/worker.py", b"")
    symlink = tarfile.TarInfo("openclaw_client/link.py")
    symlink.type, symlink.linkname = tarfile.SYMTYPE, "/etc/passwd"
    hardlink = tarfile.TarInfo("openclaw_client/hard.py")
    hardlink.type, hardlink.linkname = tarfile.LNKTYPE, BUNDLE_MANIFEST_NAME
    fifo = tarfile.TarInfo("openclaw_client/pipe")
    fifo.type = tarfile.FIFOTYPE
    return {
        "parent": [manifest, worker, regular("../escape.py", b"x")],
        "nested-parent": [manifest, worker, regular("openclaw_client/../../escape.py", b"x")],
        "absolute": [manifest, worker, regular("/tmp/absolute.py", b"x")],
        "symlink": [manifest, worker, (symlink, None)],
        "hardlink": [manifest, worker, (hardlink, None)],
        "fifo": [manifest, worker, (fifo, None)],
        "duplicate": [manifest, worker, regular("openclaw_client/worker.py", b"again")],
        "no-manifest": [worker],
        "no-worker": [manifest],
    }


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("parent", "bundle member '../escape.py' is unsafe"),
        ("nested-parent", "bundle member 'openclaw_client/../../escape.py' is unsafe"),
        ("absolute", "bundle member '/tmp/absolute.py' is unsafe: path is absolute"),
        ("symlink", "bundle member 'openclaw_client/link.py' is not a regular file"),
        ("hardlink", "bundle member 'openclaw_client/hard.py' is not a regular file"),
        ("fifo", "bundle member 'openclaw_client/pipe' is not a regular file"),
        ("duplicate", "bundle member 'openclaw_client/worker.py' appears twice"),
        ("no-manifest", "the bundle has no readable openclaw-worker-bundle.json"),
        ("no-worker", "the bundle has no worker program"),
    ],
)
def test_bundle_extraction_refuses_anything_but_safe_regular_files(tmp_path, server, case, message):
    data = archive(unsafe_members()[case])
    host = host_for(tmp_path / "state", server)
    upload = tmp_path / "upload.tar.gz"
    upload.write_bytes(data)
    with pytest.raises(BundleInstallError) as failure:
        host.bundles.install_archive(upload, sha(data))
    assert str(failure.value).startswith(message)
    assert host.bundles.hashes() == [] and list(host.bundles.root.iterdir()) == []
    assert not (tmp_path / "escape.py").exists() and not Path("/tmp/absolute.py").exists()


def test_bundle_extraction_refuses_a_checksum_mismatch_a_non_archive_and_past_the_limits(tmp_path, server, monkeypatch):
    host = host_for(tmp_path / "state", server)
    upload = tmp_path / "upload.tar.gz"
    upload.write_bytes(fake_bundle())
    with pytest.raises(BundleInstallError, match="does not match the bundle's sha256"):
        host.bundles.install_archive(upload, sha(b"something else"))
    upload.write_bytes(b"not a tarball at all")
    with pytest.raises(BundleInstallError, match=r"not a valid \.tar\.gz"):
        host.bundles.install_archive(upload, sha(b"not a tarball at all"))
    upload.write_bytes(fake_bundle())
    monkeypatch.setattr(node_module, "MAX_BUNDLE_FILES", 2)
    with pytest.raises(BundleInstallError, match="past its size limits"):
        host.bundles.install_archive(upload, sha(fake_bundle()))
    assert host.bundles.hashes() == []


# --- worker.workspace.prepare.v1 / export.v1 ------------------------------------------------------


def workspace_source(tmp_path: Path) -> tuple[list[dict], dict[str, str]]:
    source = tmp_path / "source"
    (source / "src").mkdir(parents=True)
    (source / "src/app.py").write_bytes(b"print('app')\n")
    (source / "README.md").write_bytes(b"# readme\n")
    (source / "copy.md").write_bytes(b"# readme\n")  # the same content twice: one blob
    manifest = build_manifest(source)
    blobs = {entry["sha256"]: base64.b64encode((source / entry["path"]).read_bytes()).decode() for entry in manifest}
    return manifest, blobs


def prepare_params(manifest: list[dict], **extra: Any) -> dict[str, Any]:
    return {
        "environmentId": "worker:env-1",
        "leaseId": "lease-1",
        "sessionId": "session-1",
        "manifestRef": manifest_ref(manifest),
        "manifest": manifest,
        **extra,
    }


def test_prepare_asks_for_missing_blobs_then_materializes_and_is_idempotent(tmp_path, server):
    manifest, blobs = workspace_source(tmp_path)
    first_digest, second_digest = sorted(blobs)

    async def scenario(host: NodeHost):
        missing = await call(host, "worker.workspace.prepare.v1", **prepare_params(manifest))
        partial = await call(
            host, "worker.workspace.prepare.v1", **prepare_params(manifest, blobs={first_digest: blobs[first_digest]})
        )
        ready = await call(
            host, "worker.workspace.prepare.v1", **prepare_params(manifest, blobs={second_digest: blobs[second_digest]})
        )
        again = await call(host, "worker.workspace.prepare.v1", **prepare_params(manifest))
        status = await call(host, "worker.status.v1")
        return missing, partial, ready, again, status, host.environments.workspace("worker:env-1")

    missing, partial, ready, again, status, workspace = run(tmp_path, server, scenario)
    assert missing == {"status": "missing", "missing": sorted(blobs)}
    assert partial == {"status": "missing", "missing": [second_digest]}
    assert ready == {"status": "ready", "manifestRef": manifest_ref(manifest), "remoteWorkspaceDir": str(workspace)}
    assert again == ready
    assert build_manifest(workspace) == manifest
    assert status["environments"] == ["worker:env-1"]


def test_prepare_refuses_a_manifest_that_is_not_its_ref_or_unsafe_and_content_that_is_not_its_digest(tmp_path, server):
    manifest, blobs = workspace_source(tmp_path)
    digest = next(iter(blobs))
    unsafe = [{"path": "../escape", "sha256": digest, "size": 1, "mode": 0o644}]

    async def scenario(host: NodeHost):
        wrong_ref = await refused(
            host, "worker.workspace.prepare.v1", **prepare_params(manifest, manifestRef=manifest_ref([]))
        )
        escaping = await refused(host, "worker.workspace.prepare.v1", **prepare_params(unsafe))
        not_a_list = await refused(
            host, "worker.workspace.prepare.v1", **{**prepare_params(manifest), "manifest": {"a": 1}}
        )
        tampered = await refused(
            host,
            "worker.workspace.prepare.v1",
            **prepare_params(manifest, blobs={digest: base64.b64encode(b"tampered").decode()}),
        )
        not_base64 = await refused(host, "worker.workspace.prepare.v1", **prepare_params(manifest, blobs={digest: "*"}))
        return wrong_ref, escaping, not_a_list, tampered, not_base64, host

    wrong_ref, escaping, not_a_list, tampered, not_base64, host = run(tmp_path, server, scenario)
    assert (wrong_ref.code, wrong_ref.message) == (
        "INVALID_MANIFEST",
        "invalid workspace manifest: manifest does not match manifestRef",
    )
    assert escaping.code == "INVALID_MANIFEST" and "'..' segment" in escaping.message
    assert not_a_list.code == "INVALID_MANIFEST"
    assert tampered.code == "BLOB_MISMATCH" and digest in tampered.message
    assert not_base64.code == "INVALID_MANIFEST"
    assert not host.blobs.has(digest)
    assert not host.environments.has_workspace("worker:env-1")


def test_export_returns_the_current_manifest_and_only_the_changed_content(tmp_path, server):
    manifest, blobs = workspace_source(tmp_path)
    base_ref = manifest_ref(manifest)

    async def scenario(host: NodeHost):
        await call(host, "worker.workspace.prepare.v1", **prepare_params(manifest, blobs=blobs))
        unchanged = await call(
            host, "worker.workspace.export.v1", environmentId="worker:env-1", baseManifestRef=base_ref
        )
        workspace = host.environments.workspace("worker:env-1")
        (workspace / "src/app.py").write_bytes(b"print('changed')\n")
        (workspace / "new.txt").write_bytes(b"new file\n")
        (workspace / "copy.md").unlink()
        changed = await call(host, "worker.workspace.export.v1", environmentId="worker:env-1", baseManifestRef=base_ref)
        return unchanged, changed, build_manifest(workspace)

    unchanged, changed, current = run(tmp_path, server, scenario)
    assert unchanged == {"manifestRef": base_ref, "manifest": manifest, "blobs": {}, "hasMore": False}
    assert changed["manifest"] == current and changed["manifestRef"] == manifest_ref(current)
    assert changed["hasMore"] is False and "cursor" not in changed
    assert {digest: base64.b64decode(data) for digest, data in changed["blobs"].items()} == {
        sha(b"print('changed')\n"): b"print('changed')\n",
        sha(b"new file\n"): b"new file\n",
    }


def test_export_pages_its_blobs_with_a_cursor(tmp_path, server, monkeypatch):
    manifest, blobs = workspace_source(tmp_path)
    monkeypatch.setattr(node_module, "EXPORT_PAGE_BYTES", 10)

    async def scenario(host: NodeHost):
        await call(host, "worker.workspace.prepare.v1", **prepare_params(manifest, blobs=blobs))
        workspace = host.environments.workspace("worker:env-1")
        for index in range(3):
            (workspace / f"out-{index}.txt").write_bytes(f"output {index}\n".encode())
        pages, cursor = [], None
        while True:
            params = {"environmentId": "worker:env-1", "baseManifestRef": manifest_ref(manifest)}
            if cursor:
                params["cursor"] = cursor
            page = await call(host, "worker.workspace.export.v1", **params)
            pages.append(page)
            if not page["hasMore"]:
                break
            cursor = page["cursor"]
        stale = await refused(
            host,
            "worker.workspace.export.v1",
            environmentId="worker:env-1",
            baseManifestRef=manifest_ref(manifest),
            cursor="sha256:" + "0" * 64 + "@1",
        )
        return pages, stale

    pages, stale = run(tmp_path, server, scenario)
    assert len(pages) == 3 and all(len(page["blobs"]) == 1 for page in pages)
    assert len({page["manifestRef"] for page in pages}) == 1
    assert {base64.b64decode(data) for page in pages for data in page["blobs"].values()} == {
        f"output {index}\n".encode() for index in range(3)
    }
    assert (stale.code, stale.message) == (
        "INVALID_REQUEST",
        "export cursor is not current; export again without a cursor",
    )


def test_export_of_an_environment_without_a_workspace_is_workspace_missing(tmp_path, server):
    async def scenario(host: NodeHost):
        return await refused(
            host, "worker.workspace.export.v1", environmentId="nowhere", baseManifestRef=manifest_ref([])
        )

    failure = run(tmp_path, server, scenario)
    assert (failure.code, failure.message) == ("WORKSPACE_MISSING", "no workspace for environment nowhere on this node")


# --- worker.launch.v1 / cancel / status -----------------------------------------------------------


def test_a_turn_streams_progress_and_returns_the_reply_and_the_warm_child_serves_the_next(tmp_path, server):
    async def scenario(host: NodeHost):
        bundle_hash = install_local(host, real_bundle())
        prepare_local(host, "env-1", {"a.txt": b"a"})
        progress = Progress()
        progress.install()
        first = await call(host, "worker.launch.v1", **launch_params(server, "env-1", bundle_hash, path="/v1/paced"))
        idle_after_first = host.pool.reclaimable_idle
        warm_pid = host.pool._idle[0].child.process.pid
        inventory = host.inventory()
        second = await call(
            host,
            "worker.launch.v1",
            **launch_params(server, "env-1", bundle_hash, "again", runId="run-2", path="/v1/echo"),
        )
        reused = host.pool._idle[0].child.process.pid == warm_pid
        return first, second, progress.sent, idle_after_first, inventory, reused

    first, second, sent, idle, inventory, reused = run(tmp_path, server, scenario, capacity=2)
    assert first == {
        "status": "ok",
        "text": "Hello",
        "stopReason": "stop",
        "usage": {"input": 3, "output": 2, "totalTokens": 5},
        "model": "mock-model",
    }
    assert sent[:2] == [
        {"id": "invoke-1", "seq": 1, "data": {"kind": "delta", "delta": "Hel", "text": "Hel"}},
        {"id": "invoke-1", "seq": 2, "data": {"kind": "delta", "delta": "lo", "text": "Hello"}},
    ]
    assert second["text"] == "again" and reused
    assert idle == 1
    assert inventory["workerHost"]["capacity"] == {"total": 2, "available": 1, "reclaimableIdle": 1}
    assert parse_declaration(inventory).hosting
    path, headers, _body = server.requests[0]
    assert path == "/v1/paced" and headers["Authorization"] == f"Bearer {TOKEN}"


def test_a_reply_that_ends_within_the_progress_window_comes_whole_in_the_result(tmp_path, server):
    async def scenario(host: NodeHost):
        bundle_hash = install_local(host, real_bundle())
        prepare_local(host, "env-1", {"a.txt": b"a"})
        progress = Progress()
        progress.install()
        result = await call(host, "worker.launch.v1", **launch_params(server, "env-1", bundle_hash))
        await asyncio.sleep(PROGRESS_COALESCE_S * 4)  # a progress left behind would have gone out by now
        return result, progress.sent

    result, sent = run(tmp_path, server, scenario)
    assert result["status"] == "ok" and result["text"] == "Hello"
    assert sent == []


def test_deltas_within_one_window_leave_as_one_progress_with_the_latest_text():
    async def scenario():
        sent: list[dict[str, Any]] = []

        async def send(data: dict[str, Any]) -> None:
            sent.append(data)

        deltas = CoalescedDeltas(send)
        await deltas.add({"delta": "He", "text": "He"})
        await deltas.add({"delta": "l", "text": "Hel"})
        await asyncio.sleep(PROGRESS_COALESCE_S * 4)
        await deltas.add({"delta": "lo", "text": "Hello"})
        await asyncio.sleep(PROGRESS_COALESCE_S * 4)
        await deltas.add({"delta": "!", "text": "Hello!"})  # the turn ends inside this window
        await deltas.close()
        await asyncio.sleep(PROGRESS_COALESCE_S * 4)
        return sent

    assert asyncio.run(scenario()) == [
        {"kind": "delta", "delta": "Hel", "text": "Hel"},
        {"kind": "delta", "delta": "lo", "text": "Hello"},
    ]


def test_closing_the_deltas_waits_for_a_progress_being_sent():
    async def scenario():
        events: list[str] = []
        release = asyncio.Event()

        async def slow_send(data: dict[str, Any]) -> None:
            events.append("send started")
            await release.wait()
            events.append("send done")

        deltas = CoalescedDeltas(slow_send)
        await deltas.add({"delta": "a", "text": "a"})
        while not events:
            await asyncio.sleep(0.001)
        closing = asyncio.ensure_future(deltas.close())
        await asyncio.sleep(PROGRESS_COALESCE_S * 2)
        closed_before_release = closing.done()
        release.set()
        await closing
        events.append("closed")
        return closed_before_release, events

    closed_before_release, events = asyncio.run(scenario())
    assert not closed_before_release
    assert events == ["send started", "send done", "closed"]


def test_a_failed_progress_send_is_logged_and_does_not_fail_the_turn(caplog):
    async def scenario():
        async def broken_send(data: dict[str, Any]) -> None:
            raise RuntimeError("socket gone")

        deltas = CoalescedDeltas(broken_send)
        await deltas.add({"delta": "a", "text": "a"})
        await asyncio.sleep(PROGRESS_COALESCE_S * 4)
        await deltas.close()

    asyncio.run(scenario())
    assert "a turn's progress could not be sent" in caplog.text


def test_the_child_runs_the_bundle_s_code_in_the_workspace_without_the_node_s_secrets(tmp_path, server, monkeypatch):
    monkeypatch.setenv("OPENCLAW_GATEWAY_TOKEN", "gateway-secret")

    async def scenario(host: NodeHost):
        bundle_hash = install_local(host, fake_bundle())
        prepare_local(host, "env-1", {"a.txt": b"a"})
        result = await call(host, "worker.launch.v1", **launch_params(server, "env-1", bundle_hash))
        return result, host.bundles.directory(bundle_hash), host.environments.workspace("env-1")

    result, bundle_dir, workspace = run(tmp_path, server, scenario)
    report = json.loads(result["text"])
    assert report["file"] == str(bundle_dir / "openclaw_client" / "worker.py")
    assert report["cwd"] == str(workspace)
    assert "OPENCLAW_GATEWAY_TOKEN" not in report["env"]
    assert set(report["env"]) <= {*node_module.CHILD_ENVIRONMENT_KEYS, "PYTHONPATH", "PYTHONUNBUFFERED", "LC_CTYPE"}


def test_a_child_that_dies_mid_turn_is_worker_failed_and_its_slot_comes_back(tmp_path, server):
    async def scenario(host: NodeHost):
        bundle_hash = install_local(host, fake_bundle())
        prepare_local(host, "env-1", {"a.txt": b"a"})
        failure = await refused(host, "worker.launch.v1", **launch_params(server, "env-1", bundle_hash, "die"))
        capacity = host.pool.capacity()
        after = await call(host, "worker.launch.v1", **launch_params(server, "env-1", bundle_hash, runId="run-2"))
        return failure, capacity, after

    failure, capacity, after = run(tmp_path, server, scenario)
    assert (failure.code, failure.message) == (
        "WORKER_FAILED",
        "worker failed: the worker process exited unexpectedly (exit code 3)",
    )
    assert capacity == {"total": 1, "available": 1, "reclaimableIdle": 0}
    assert after["status"] == "ok"


def test_a_launch_needs_its_bundle_and_its_workspace(tmp_path, server):
    async def scenario(host: NodeHost):
        no_bundle = await refused(host, "worker.launch.v1", **launch_params(server, "env-1", "a" * 64))
        bundle_hash = install_local(host, fake_bundle())
        no_workspace = await refused(host, "worker.launch.v1", **launch_params(server, "env-1", bundle_hash))
        bad_messages = await refused(
            host, "worker.launch.v1", **launch_params(server, "env-1", bundle_hash, messages=[{"role": "user"}])
        )
        return no_bundle, no_workspace, bad_messages

    no_bundle, no_workspace, bad_messages = run(tmp_path, server, scenario)
    assert (no_bundle.code, no_bundle.message) == ("BUNDLE_MISSING", "the worker bundle is not installed on this node")
    assert (no_workspace.code, no_workspace.message) == (
        "WORKSPACE_MISSING",
        "no workspace for environment env-1 on this node",
    )
    assert (bad_messages.code, bad_messages.message) == (
        "INVALID_REQUEST",
        "worker.launch.v1: messages must be a list of chat messages ({role, content, tool_calls?, tool_call_id?})",
    )


def test_a_launch_waits_for_capacity_then_fails_with_worker_capacity_exhausted(tmp_path, server):
    async def scenario(host: NodeHost):
        bundle_hash = install_local(host, fake_bundle())
        prepare_local(host, "env-1", {"a.txt": b"a"})
        held = await host.pool.take("f" * 64, 0)  # a slot some other turn holds
        assert held is None
        started = asyncio.get_running_loop().time()
        full = await refused(host, "worker.launch.v1", **launch_params(server, "env-1", bundle_hash))
        waited = asyncio.get_running_loop().time() - started
        await host.pool.release(None, reusable=False)
        after = await call(host, "worker.launch.v1", **launch_params(server, "env-1", bundle_hash, runId="run-2"))
        return full, waited, after

    full, waited, after = run(tmp_path, server, scenario, wait_ms=300)
    assert (full.code, full.message) == ("WORKER_CAPACITY_EXHAUSTED", "node worker capacity remained full for 300 ms")
    assert 0.25 <= waited < 3
    assert after["status"] == "ok"


def test_a_waiting_launch_gets_the_slot_as_soon_as_it_is_released(tmp_path, server):
    async def scenario(host: NodeHost):
        bundle_hash = install_local(host, fake_bundle())
        prepare_local(host, "env-1", {"a.txt": b"a"})
        await host.pool.take("f" * 64, 0)
        launch = asyncio.create_task(call(host, "worker.launch.v1", **launch_params(server, "env-1", bundle_hash)))
        await asyncio.sleep(0.2)
        await host.pool.release(None, reusable=False)
        return await launch

    assert run(tmp_path, server, scenario, wait_ms=5_000)["status"] == "ok"


def test_another_bundle_s_idle_child_is_reclaimed_when_no_slot_is_free(tmp_path, server):
    async def scenario(host: NodeHost):
        real = install_local(host, real_bundle())
        fake = install_local(host, fake_bundle())
        prepare_local(host, "env-1", {"a.txt": b"a"})
        await call(host, "worker.launch.v1", **launch_params(server, "env-1", real))
        assert host.pool.idle_bundles() == {real}
        result = await call(host, "worker.launch.v1", **launch_params(server, "env-1", fake, runId="run-2"))
        return result, host.pool.idle_bundles()

    result, idle = run(tmp_path, server, scenario, wait_ms=0)
    assert result["status"] == "ok"
    assert idle == {sha(fake_bundle())}


def test_cancel_aborts_a_running_turn_and_status_shows_it_while_it_runs(tmp_path, server):
    async def scenario(host: NodeHost):
        bundle_hash = install_local(host, real_bundle())
        prepare_local(host, "env-1", {"a.txt": b"a"})
        progress = Progress()
        progress.install()
        launch = asyncio.create_task(
            call(host, "worker.launch.v1", **launch_params(server, "env-1", bundle_hash, path="/v1/stall"))
        )
        while not progress.sent:
            await asyncio.sleep(0.02)
        status = await call(host, "worker.status.v1")
        cancelled = await call(host, "worker.cancel.v1", runId="run-1")
        result = await launch
        unknown = await call(host, "worker.cancel.v1", runId="run-1")
        return status, cancelled, result, unknown, await call(host, "worker.status.v1")

    status, cancelled, result, unknown, after = run(tmp_path, server, scenario, capacity=2)
    assert status["capacity"] == {"total": 2, "available": 1, "reclaimableIdle": 0}
    assert [(run["runId"], run["environmentId"], run["sessionId"]) for run in status["running"]] == [
        ("run-1", "env-1", "session-1")
    ]
    assert isinstance(status["running"][0]["startedAtMs"], int)
    assert status["environments"] == ["env-1"]
    assert cancelled == {"cancelled": True}
    assert result == {"status": "aborted", "text": "first"}
    assert unknown == {"cancelled": False}
    assert after["running"] == [] and after["capacity"] == {"total": 2, "available": 1, "reclaimableIdle": 1}


def test_cancelling_a_launch_that_waits_for_capacity_aborts_it(tmp_path, server):
    async def scenario(host: NodeHost):
        bundle_hash = install_local(host, fake_bundle())
        prepare_local(host, "env-1", {"a.txt": b"a"})
        await host.pool.take("f" * 64, 0)
        launch = asyncio.create_task(call(host, "worker.launch.v1", **launch_params(server, "env-1", bundle_hash)))
        await asyncio.sleep(0.1)
        cancelled = await call(host, "worker.cancel.v1", runId="run-1")
        return cancelled, await asyncio.wait_for(launch, 2)

    cancelled, result = run(tmp_path, server, scenario, wait_ms=10_000)
    assert cancelled == {"cancelled": True}
    assert result == {"status": "aborted", "text": ""}


# --- worker.environment.stop.v1 -------------------------------------------------------------------


async def stalled_turn_beside_a_second_environment(host: NodeHost, server) -> tuple[str, asyncio.Task]:
    """env-1 and env-2 prepared, and a turn launched on env-1 that stalls in its model call (already started)."""
    bundle_hash = install_local(host, real_bundle())
    prepare_local(host, "env-1", {"a.txt": b"a"})
    prepare_local(host, "env-2", {"b.txt": b"b"}, lease="lease-2")
    progress = Progress()
    progress.install()
    launch = asyncio.create_task(
        call(host, "worker.launch.v1", **launch_params(server, "env-1", bundle_hash, path="/v1/stall"))
    )
    while not progress.sent:
        await asyncio.sleep(0.02)
    return bundle_hash, launch


def test_stop_cancels_the_environment_s_turn_and_deletes_its_workspace_idempotently(tmp_path, server):
    async def scenario(host: NodeHost):
        _bundle_hash, launch = await stalled_turn_beside_a_second_environment(host, server)
        stopped = await call(host, "worker.environment.stop.v1", environmentId="env-1")
        result = await launch
        again = await call(host, "worker.environment.stop.v1", environmentId="env-1")
        by_lease = await call(host, "worker.environment.stop.v1", leaseId="lease-2")
        neither = await refused(host, "worker.environment.stop.v1")
        return stopped, result, again, by_lease, neither, await call(host, "worker.status.v1"), host

    stopped, result, again, by_lease, neither, status, host = run(tmp_path, server, scenario)
    assert stopped == {"stopped": True, "environmentIds": ["env-1"]}
    assert result["status"] == "aborted"
    assert again == {"stopped": True, "environmentIds": []}
    assert by_lease == {"stopped": True, "environmentIds": ["env-2"]}
    assert (neither.code, neither.message) == (
        "INVALID_REQUEST",
        "worker.environment.stop.v1 needs environmentId or leaseId",
    )
    assert status["environments"] == []
    assert not host.environments.known()


# --- worker.workspace.retain.v1 -------------------------------------------------------------------


def retain_params(sequence: int, environments: list[str], bundles: list[str], status_hash: str, **extra: Any) -> dict:
    return {
        "gatewayNamespace": "default",
        "controllerId": extra.pop("controllerId", "controller-1"),
        "sequence": sequence,
        "retain": [
            {"environmentId": env, "sessionId": f"session-{env}", "generation": 1, "manifestRefs": None}
            for env in environments
        ],
        "bundleHashes": bundles,
        "bundleStatusHash": status_hash,
        **extra,
    }


def test_retain_deletes_what_is_not_listed_and_reports_the_bundle_status(tmp_path, server, monkeypatch):
    monkeypatch.setattr(node_module, "BLOB_GC_GRACE_S", -60)

    async def scenario(host: NodeHost):
        kept_bundle = install_local(host, real_bundle())
        old_bundle = install_local(host, fake_bundle())
        prepare_local(host, "keep", {"kept.txt": b"kept"})
        prepare_local(host, "drop", {"dropped.txt": b"dropped"})
        applied = await call(
            host, "worker.workspace.retain.v1", **retain_params(2, ["keep"], [kept_bundle], kept_bundle)
        )
        stale = await call(host, "worker.workspace.retain.v1", **retain_params(2, [], [], kept_bundle))
        other_controller = await call(
            host,
            "worker.workspace.retain.v1",
            **retain_params(1, ["keep"], [kept_bundle], old_bundle, controllerId="c2"),
        )
        return kept_bundle, old_bundle, applied, stale, other_controller, host

    kept_bundle, old_bundle, applied, stale, other_controller, host = run(tmp_path, server, scenario)
    assert applied == {
        "applied": True,
        "deleted": {"environments": ["drop"], "bundles": [old_bundle]},
        "hasMore": False,
        "bundleStatus": "installed",
    }
    assert stale == {
        "applied": False,
        "deleted": {"environments": [], "bundles": []},
        "hasMore": False,
        "bundleStatus": "installed",
    }
    assert other_controller["applied"] is True and other_controller["bundleStatus"] == "missing"
    assert host.environments.prepared() == ["keep"]
    assert host.bundles.hashes() == [kept_bundle]
    assert host.blobs.has(sha(b"kept")) and not host.blobs.has(sha(b"dropped"))  # unreferenced content collected


def test_retain_reports_missing_once_the_bundle_directory_is_gone(tmp_path, server):
    async def scenario(host: NodeHost):
        bundle_hash = install_local(host, fake_bundle())
        before = await call(host, "worker.workspace.retain.v1", **retain_params(1, [], [bundle_hash], bundle_hash))
        host.bundles.delete(bundle_hash)
        after = await call(host, "worker.workspace.retain.v1", **retain_params(2, [], [bundle_hash], bundle_hash))
        return before, after

    before, after = run(tmp_path, server, scenario)
    assert before["bundleStatus"] == "installed" and after["bundleStatus"] == "missing"


def test_bundle_status_is_read_from_the_disk_not_from_what_the_node_remembers(tmp_path, server):
    """Issue 26 point 8: a bundle directory removed behind the node's back (not through its own delete) is
    ``missing`` at the next retain of the same running host, and a launch of it is ``BUNDLE_MISSING``."""

    async def scenario(host: NodeHost):
        bundle_hash = install_local(host, fake_bundle())
        prepare_local(host, "env-1", {"a.txt": b"a"})
        before = await call(
            host, "worker.workspace.retain.v1", **retain_params(1, ["env-1"], [bundle_hash], bundle_hash)
        )
        shutil.rmtree(host.bundles.directory(bundle_hash))
        after = await call(
            host, "worker.workspace.retain.v1", **retain_params(2, ["env-1"], [bundle_hash], bundle_hash)
        )
        launch = await refused(host, "worker.launch.v1", **launch_params(server, "env-1", bundle_hash))
        return before, after, launch

    before, after, launch = run(tmp_path, server, scenario)
    assert (before["bundleStatus"], after["bundleStatus"]) == ("installed", "missing")
    assert (launch.code, launch.message) == ("BUNDLE_MISSING", "the worker bundle is not installed on this node")


def test_retain_never_deletes_a_bundle_a_running_turn_uses(tmp_path, server):
    async def scenario(host: NodeHost):
        bundle_hash = install_local(host, real_bundle())
        prepare_local(host, "env-1", {"a.txt": b"a"})
        progress = Progress()
        progress.install()
        launch = asyncio.create_task(
            call(host, "worker.launch.v1", **launch_params(server, "env-1", bundle_hash, path="/v1/stall"))
        )
        while not progress.sent:
            await asyncio.sleep(0.02)
        retained = await call(host, "worker.workspace.retain.v1", **retain_params(1, ["env-1"], [], bundle_hash))
        server.release.set()
        await call(host, "worker.cancel.v1", runId="run-1")
        await launch
        return retained

    retained = run(tmp_path, server, scenario)
    assert retained["deleted"] == {"environments": [], "bundles": []}
    assert retained["bundleStatus"] == "installed"


def test_retain_params_are_checked(tmp_path, server):
    async def scenario(host: NodeHost):
        return await refused(
            host,
            "worker.workspace.retain.v1",
            **retain_params(1, [], [], "a" * 64, retain=[{"environmentId": "e", "sessionId": "s", "generation": -1}]),
        )

    failure = run(tmp_path, server, scenario)
    assert (failure.code, failure.message) == (
        "INVALID_REQUEST",
        "worker.workspace.retain.v1: retain[0].generation must be an integer from 0 to 9223372036854775807",
    )


def test_a_node_removes_staging_directories_an_interrupted_run_left(tmp_path, server):
    host = host_for(tmp_path / "state", server)
    install_local(host, fake_bundle())
    (host.bundles.root / ".install-abc-123").mkdir()
    host.environments.workspaces.mkdir(parents=True)
    (host.environments.workspaces / ".env-1.new-xyz").mkdir()
    host.remove_leftovers()
    assert [entry.name for entry in host.bundles.root.iterdir()] == [sha(fake_bundle())]
    assert list(host.environments.workspaces.iterdir()) == []
    assert os.path.isdir(host.bundles.directory(sha(fake_bundle())))


# --- a removed pairing ----------------------------------------------------------------------------


def pairing_required(reason: str = "not-paired") -> ConnectError:
    details = {"code": "PAIRING_REQUIRED", "reason": reason, "requestId": "request-1"}
    return ConnectError({"code": "NOT_PAIRED", "message": "pairing required: device is not paired", "details": details})


def state_entries(state: Path) -> dict[str, list[str]]:
    """What the node keeps for its gateway, as it lies on the disk."""

    def listed(folder: str) -> list[str]:
        root = state / folder
        return sorted(str(path.relative_to(root)) for path in root.rglob("*")) if root.is_dir() else []

    return {folder: listed(folder) for folder in ("workspaces", "environments", "bundles", "blobs")}


def test_a_node_refused_as_no_longer_paired_deletes_everything_of_that_gateway_and_its_token(tmp_path, server):
    """Issue 26 "a removed node leaves nothing behind": learning at a connect that its pairing is gone (also
    after being offline at the removal), the node cancels its turns and deletes its workspaces, environment
    records, bundles and blobs, then forgets the token; the journal says what went."""
    journal = tmp_path / "journal.jsonl"

    async def scenario(host: NodeHost):
        bundle_hash, launch = await stalled_turn_beside_a_second_environment(host, server)
        await host._on_refused(pairing_required())
        return bundle_hash, await launch

    bundle_hash, turn = run(tmp_path, server, scenario, journal_path=journal)
    assert turn["status"] == "aborted"
    assert state_entries(tmp_path / "state") == {"workspaces": [], "environments": [], "bundles": [], "blobs": []}
    assert IdentityStore(tmp_path / "state").device_token("node") is None
    (record,) = [json.loads(line) for line in journal.read_text().splitlines()]
    assert (record["kind"], record["deleted"]) == (
        "pairing-removed",
        {"environments": ["env-1", "env-2"], "bundles": [bundle_hash]},
    )


@pytest.mark.parametrize(
    "refusal",
    [
        "never-paired",  # a new node waiting for its first approval holds no token
        "token-mismatch",  # a rotated token is not a removal
        "other-reason",
    ],
)
def test_other_refusals_delete_nothing(tmp_path, server, refusal):
    async def scenario(host: NodeHost):
        install_local(host, fake_bundle())
        prepare_local(host, "env-1", {"a.txt": b"a"})
        if refusal == "never-paired":
            IdentityStore(host.config.state_dir).forget_device_token("node")
            await host._on_refused(pairing_required())
        elif refusal == "token-mismatch":
            details = {"code": "AUTH_DEVICE_TOKEN_MISMATCH", "authReason": "device_token_mismatch"}
            await host._on_refused(ConnectError({"code": "INVALID_REQUEST", "message": "mismatch", "details": details}))
        else:
            await host._on_refused(pairing_required(reason="scope-upgrade"))

    before_token = refusal != "never-paired"
    run(tmp_path, server, scenario)
    entries = state_entries(tmp_path / "state")
    assert entries["workspaces"] and entries["environments"] and entries["bundles"] and entries["blobs"]
    assert (IdentityStore(tmp_path / "state").device_token("node") is not None) == before_token


def test_the_journal_keeps_one_previous_file_past_its_bound(tmp_path):
    journal = Journal(tmp_path / "journal.jsonl", max_bytes=200)
    for index in range(12):
        journal.record("invoke-error", command="worker.launch.v1", index=index)
    current = [json.loads(line)["index"] for line in (tmp_path / "journal.jsonl").read_text().splitlines()]
    previous = [json.loads(line)["index"] for line in (tmp_path / "journal.jsonl.1").read_text().splitlines()]
    assert previous + current == list(range(previous[0], 12)) and current
    assert {path.name for path in tmp_path.iterdir()} == {"journal.jsonl", "journal.jsonl.1"}
    assert (tmp_path / "journal.jsonl").stat().st_size < 200 + 120
