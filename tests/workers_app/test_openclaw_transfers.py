"""Workspace sync and reconcile with OpenClaw's node host (``workers_app.nodes.openclaw.workspace`` and its
routes, ``…/transfer_http``): the drivers send ``worker.workspace.exec.v1`` transfers, and a stand-in for
OpenClaw's node answers them the way its transfer client does (``downloadWorkspace`` / ``uploadWorkspace``),
over the gateway's real ASGI application. While an operation is open the tests also probe the routes with
everything they must refuse.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import pytest
from asgiref.sync import async_to_sync

from gateway import state
from gateway.invoke import NodeCommandFailed
from openclaw_client.workspace import build_manifest
from openclaw_site.asgi import application
from sessions_app.models import Session
from sessions_app.services.sessions import SessionSpec, session_create, session_reset
from tests.workers_app.test_placement_store import walk
from workers_app.models import Placement, WorkerEnvironment, WorkspaceManifest
from workers_app.nodes import runtime
from workers_app.nodes.device_provider import device_profile
from workers_app.nodes.openclaw import manifest as oc
from workers_app.nodes.openclaw import workspace
from workers_app.nodes.openclaw.dialect import gateway_namespace
from workers_app.nodes.runtime import node_runtime
from workers_app.providers import WorkerLease, WorkerProviderError
from workers_app.services import environments as envs
from workers_app.services import moves
from workers_app.services import placements as store
from workers_app.services.placements import Actor

# Transactional: the routes read through database_sync_to_async, which closes the thread's connection.
pytestmark = pytest.mark.django_db(transaction=True)

NODE = "c3" * 32
ENVIRONMENT = "worker:" + "5e" * 16  # a colon: the route takes it percent-encoded, as OpenClaw's node sends it
BASE = "/__openclaw__/worker-transfer/v1/environments/" + quote(ENVIRONMENT, safe="")
NOT_FOUND = {"error": "not_found"}


# --- HTTP against the gateway's ASGI application -------------------------------------------------------


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def http(method: str, path: str, token: str | None = None, body: bytes = b"", **headers: str) -> Answer:
    raw_path, _, query = path.partition("?")
    sent_headers = [(name.replace("_", "-").encode(), value.encode()) for name, value in headers.items()]
    if token is not None:
        sent_headers.append((b"authorization", f"Bearer {token}".encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": unquote(raw_path),
        "raw_path": raw_path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": sent_headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 18789),
    }
    pieces = [body[i : i + 4096] for i in range(0, len(body), 4096)] or [b""]
    incoming = [{"type": "http.request", "body": p, "more_body": n < len(pieces) - 1} for n, p in enumerate(pieces)]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async_to_sync(application)(scope, receive, send)
    start = sent[0]
    answer_headers = {name.decode().lower(): value.decode() for name, value in start["headers"]}
    assert answer_headers.get("cache-control") == "no-store"
    return Answer(start["status"], answer_headers, b"".join(m.get("body", b"") for m in sent[1:]))


# --- a session on an OpenClaw node ---------------------------------------------------------------------


def write(root: Path, relative: str, data: bytes, mode: int = 0o644) -> None:
    target = root / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    target.chmod(mode)


def syncing_session(worktree: Path | None, node_id: str = NODE) -> Session:
    """A session whose dispatch to an OpenClaw node reached ``syncing``: its environment leased on the node and
    bootstrapped (owner epoch 0), through the environment services."""
    session = session_create(
        spec=SessionSpec(key=f"agent:main:{hashlib.sha1(str(worktree).encode()).hexdigest()}", agent_id="main")
    )
    if worktree is not None:
        Session.objects.filter(pk=session.pk).update(worktree={"path": str(worktree), "branch": "openclaw/x"})
        session.refresh_from_db()
    envs.environment_request(environment_id=ENVIRONMENT, profile=device_profile(node_id), operation_id="op")
    envs.environment_transition(
        environment_id=ENVIRONMENT, from_state="requested", to_state="provisioning", owner_epoch=0
    )
    lease = WorkerLease(lease_id=f"device:{node_id}:op", node_device_id=node_id)
    envs.environment_record_lease(environment_id=ENVIRONMENT, lease=lease)
    envs.environment_transition(environment_id=ENVIRONMENT, from_state="bootstrapping", to_state="ready", owner_epoch=0)
    walk(
        session,
        [
            ("requested", "provisioning", {"environment_id": ENVIRONMENT}),
            ("provisioning", "syncing", {"worker_bundle_hash": "a" * 64}),
        ],
    )
    return session


def activate(session: Session, synced: workspace.WorkspaceSync) -> Placement:
    """The rest of the dispatch after the sync: starting, the environment attached, active."""
    placement = Placement.objects.get(pk=session.pk)
    placement = store.placement_transition(
        session=session,
        from_state="syncing",
        to_state="starting",
        expected_generation=placement.generation,
        patch={"workspace_base_manifest_ref": synced.manifest_ref, "remote_workspace_dir": synced.remote_workspace_dir},
    )
    environment = envs.environment_attach_session(environment_id=ENVIRONMENT, session_id=session.session_id)
    return store.placement_transition(
        session=session,
        from_state="starting",
        to_state="active",
        expected_generation=placement.generation,
        patch={"active_owner_epoch": environment.owner_epoch},
    )


def environment() -> WorkerEnvironment:
    return WorkerEnvironment.objects.get(pk=ENVIRONMENT)


def exec_result(workspace_dir: str, stdout: str) -> dict:
    return {
        "workspaceDir": workspace_dir,
        "stdout": stdout,
        "stderr": "",
        "code": 0,
        "signal": None,
        "killed": False,
        "termination": "exit",
    }


def transfer_failed(message: str) -> NodeCommandFailed:
    return NodeCommandFailed("WORKSPACE_TRANSFER_FAILED", message)


class OpenClawNode:
    """OpenClaw's node host as far as transfers go: it keeps each session's workspace under
    ``<home>/<generation>`` and its manifests by digest, pulls and pushes over the gateway's routes, and runs
    ``before_transfer(token, params)`` first (a test's probes while the operation is open)."""

    def __init__(self, home: Path):
        self.home = home
        self.manifests: dict[str, bytes] = {}
        self.calls: list[dict] = []
        self.before_transfer: Callable[[str, dict], None] = lambda token, params: None
        self.upload_body: Callable[[bytes, bytes, list[bytes]], bytes] | None = None

    def __call__(self, node_id: str, command: str, params: dict, *, timeout_ms: int) -> dict:
        assert node_id == NODE and command == "worker.workspace.exec.v1" and timeout_ms > 600_000
        self.calls.append(params)
        transfer = params["transfer"]
        self.before_transfer(transfer["token"], params)
        workspace_dir = self.workspace_of(params["sessionId"], params["generation"])
        if transfer["direction"] == "download":
            return exec_result(str(workspace_dir), self.download(transfer, workspace_dir) + "\n")
        return exec_result(str(workspace_dir), self.upload(transfer, workspace_dir) + "\n")

    def workspace_of(self, session_id: str, generation: int = 1) -> Path:
        """Where OpenClaw's node keeps it: ``…/<sha256(envId)[:16]>/<sha256(sessionId)[:32]>/<generation>``."""
        environment_hash = hashlib.sha256(ENVIRONMENT.encode()).hexdigest()[:16]
        return self.home / environment_hash / hashlib.sha256(session_id.encode()).hexdigest()[:32] / str(generation)

    def download(self, transfer: dict, workspace_dir: Path) -> str:
        ref, token = transfer["manifestRef"], transfer["token"]
        answer = http("GET", f"{BASE}/snapshots/{ref[7:]}/manifest", token, accept_encoding="gzip")
        if answer.status != 200:
            raise transfer_failed(f"workspace-transfer-failed: gateway returned {answer.status}")
        assert answer.headers["content-encoding"] == "gzip"
        raw = gzip.decompress(answer.body)
        parsed = oc.parse(raw, expected_ref=ref)
        staging = workspace_dir.with_name(f".{workspace_dir.name}.workspace-transfer-x")
        staging.mkdir(parents=True)
        for directory in sorted(parsed.directories):
            (staging / directory).mkdir(parents=True, exist_ok=True)
        for entry in parsed.entries:
            blob = http("GET", f"{BASE}/blobs/{entry['sha256']}", token)
            if blob.status != 200:
                shutil.rmtree(staging)
                raise transfer_failed(f"workspace-transfer-failed: gateway returned {blob.status}")
            assert hashlib.sha256(blob.body).hexdigest() == entry["sha256"]
            write(staging, entry["path"], blob.body, entry["mode"])
        # The node's capture of what it wrote must be the manifest it was given.
        assert oc.serialize(oc.transferable_files(build_manifest(staging))) == raw
        shutil.rmtree(workspace_dir, ignore_errors=True)
        staging.rename(workspace_dir)
        self.manifests[ref] = raw
        return ref

    def upload(self, transfer: dict, workspace_dir: Path) -> str:
        base_raw = self.manifests[transfer["baseManifestRef"]]
        current_raw = oc.serialize(oc.transferable_files(build_manifest(workspace_dir)))
        changed = oc.changed_files(oc.parse(base_raw), oc.parse(current_raw))
        files = [(workspace_dir / entry["path"]).read_bytes() for entry in changed]
        make = self.upload_body or upload_body
        body = make(base_raw, current_raw, files)
        answer = http(
            "POST",
            f"{BASE}/reconciliations/{transfer['baseManifestRef'][7:]}",
            transfer["token"],
            body,
            content_type="application/vnd.openclaw.worker-workspace-reconcile-v1",
            content_length=str(len(body)),
        )
        if answer.status != 200:
            raise transfer_failed(
                f"workspace-transfer-invalid: gateway rejected workspace transfer payload ({answer.body})"
            )
        current_ref = oc.manifest_ref(current_raw)
        assert answer.json() == {"manifestRef": current_ref}
        self.manifests[current_ref] = current_raw
        return current_ref


def upload_body(base: bytes, current: bytes, files: list[bytes]) -> bytes:
    parts = [len(base).to_bytes(4, "big"), base, len(current).to_bytes(4, "big"), current]
    for data in files:
        parts += [len(data).to_bytes(8, "big"), data]
    return b"".join(parts)


@pytest.fixture
def node(monkeypatch, tmp_path) -> OpenClawNode:
    fake = OpenClawNode(tmp_path / "node-home")
    monkeypatch.setattr(workspace, "call_openclaw", fake)
    return fake


@pytest.fixture
def worktree(tmp_path) -> Path:
    root = tmp_path / "worktree"
    write(root, "README.md", b"# project\n")
    write(root, "src/app.py", b"print('hello')\n")
    write(root, "bin/run", b"#!/bin/sh\n", 0o755)
    write(root, "src/copy.py", b"print('hello')\n")  # same content: one blob, two paths
    write(root, "node_modules/dep/index.js", b"derived: never synced")
    (root / ".git").write_text("gitdir: /elsewhere\n")
    return root


def sync(session: Session) -> workspace.WorkspaceSync:
    return workspace.sync_workspace(NODE, workspace_root(session), session, environment())


def workspace_root(session: Session) -> Path | None:
    path = (session.worktree or {}).get("path")
    return Path(path) if path else None


# --- sync ----------------------------------------------------------------------------------------------


def test_a_sync_materializes_the_worktree_on_the_node_and_keeps_its_manifest(node, worktree):
    session = syncing_session(worktree)

    synced = sync(session)

    params = node.calls[0]
    assert set(params) == {
        "gatewayNamespace",
        "environmentId",
        "sessionId",
        "generation",
        "argv",
        "timeoutMs",
        "transfer",
    }
    assert params["gatewayNamespace"] == gateway_namespace()
    assert (params["environmentId"], params["sessionId"]) == (ENVIRONMENT, session.session_id)
    assert params["generation"] == 1  # the owner epoch the attach after the sync gives the session
    assert params["argv"] == ["openclaw-internal-workspace-transfer"] and params["timeoutMs"] == 600_000
    assert set(params["transfer"]) == {"direction", "token", "manifestRef"} and len(params["transfer"]["token"]) == 43
    assert synced.manifest_ref == params["transfer"]["manifestRef"]
    assert synced.remote_workspace_dir == str(node.workspace_of(session.session_id))
    on_node = node.workspace_of(session.session_id)
    assert sorted(str(p.relative_to(on_node)) for p in on_node.rglob("*") if p.is_file()) == [
        "README.md",
        "bin/run",
        "src/app.py",
        "src/copy.py",
    ]
    assert (on_node / "bin/run").stat().st_mode & 0o777 == 0o755
    stored = WorkspaceManifest.objects.get(ref=synced.manifest_ref).manifest
    assert [entry["path"] for entry in stored] == ["README.md", "bin/run", "src/app.py", "src/copy.py"]
    # The operation ended with the sync: its token serves nothing any more.
    token = params["transfer"]["token"]
    assert http("GET", f"{BASE}/snapshots/{synced.manifest_ref[7:]}/manifest", token).status == 404


def test_a_sync_of_more_files_than_django_s_default_cache_holds_serves_every_file(node, tmp_path):
    # Each file of a download is listed in the cache for the transfer's duration; the embedded profile's
    # in-memory cache once culled them past 300 entries and the node's pulls of the rest were refused.
    root = tmp_path / "many"
    for index in range(1_000):
        write(root, f"src/file-{index:04}.txt", f"content {index}\n".encode())
    session = syncing_session(root)

    synced = sync(session)

    on_node = node.workspace_of(session.session_id)
    assert sum(1 for path in on_node.rglob("*") if path.is_file()) == 1_000
    assert synced.manifest_ref == node.calls[0]["transfer"]["manifestRef"]


def test_a_session_without_a_worktree_syncs_an_empty_workspace(node):
    session = syncing_session(None)

    synced = sync(session)

    assert synced.manifest_ref == oc.manifest_ref(b'{"version":1,"baseCommit":null,"entries":[]}')
    assert list((node.workspace_of(session.session_id)).iterdir()) == []


def test_the_routes_refuse_everything_but_the_operations_own_requests(node, worktree):
    session = syncing_session(worktree)
    probed: dict[str, int] = {}

    def probe(token: str, params: dict) -> None:
        ref_hex = params["transfer"]["manifestRef"][7:]
        digest = hashlib.sha256(b"# project\n").hexdigest()
        manifest = f"{BASE}/snapshots/{ref_hex}/manifest"
        cases = {
            "no token": ("GET", manifest, None),
            "another token": ("GET", manifest, "x" * 43),
            "another manifest": ("GET", f"{BASE}/snapshots/{'0' * 64}/manifest", token),
            "another environment": ("GET", manifest.replace(quote(ENVIRONMENT, safe=""), "worker%3Aother"), token),
            "a blob outside the manifest": (
                "GET",
                f"{BASE}/blobs/{hashlib.sha256(b'derived: never synced').hexdigest()}",
                token,
            ),
            "a query": ("GET", manifest + "?x=1", token),
            "the wrong method": ("POST", manifest, token),
            "the pack": ("GET", f"{BASE}/snapshots/{ref_hex}/pack", token),
            "a reconcile with a download token": ("POST", f"{BASE}/reconciliations/{ref_hex}", token),
            "an unknown route": ("GET", f"{BASE}/blobs/{digest}/more", token),
            "an environment id with a slash": (
                "GET",
                f"/__openclaw__/worker-transfer/v1/environments/a%2Fb/blobs/{digest}",
                token,
            ),
            "a bad environment encoding": (
                "GET",
                f"/__openclaw__/worker-transfer/v1/environments/%ff/blobs/{digest}",
                token,
            ),
        }
        for name, (method, path, bearer) in cases.items():
            answer = http(method, path, bearer)
            assert answer.json() == NOT_FOUND, name
            probed[name] = answer.status
        assert http("GET", f"{BASE}/blobs/{digest}", token).body == b"# project\n"
        # Content negotiation of the manifest, as OpenClaw's gateway does it.
        assert "content-encoding" not in http("GET", manifest, token).headers
        assert http("GET", manifest, token, accept_encoding="br").headers.get("content-encoding") is None
        assert http("GET", manifest, token, accept_encoding="gzip;q=0.5, identity;q=1").status == 200
        assert http("GET", manifest, token, accept_encoding="identity;q=0").status == 406

    node.before_transfer = probe
    sync(session)

    assert set(probed.values()) == {404} and len(probed) == 12


def test_a_download_is_refused_once_its_environment_changed_hands_or_the_placement_left_syncing(node, worktree):
    session = syncing_session(worktree)
    statuses = []

    def probe(token: str, params: dict) -> None:
        manifest = f"{BASE}/snapshots/{params['transfer']['manifestRef'][7:]}/manifest"
        statuses.append(http("GET", manifest, token).status)
        WorkerEnvironment.objects.filter(pk=ENVIRONMENT).update(owner_epoch=5)
        statuses.append(http("GET", manifest, token).status)
        WorkerEnvironment.objects.filter(pk=ENVIRONMENT).update(owner_epoch=0)
        placement = Placement.objects.get(pk=session.pk)
        patch = {"workspace_base_manifest_ref": params["transfer"]["manifestRef"], "remote_workspace_dir": "/n/1"}
        store.placement_transition(
            session=session,
            from_state="syncing",
            to_state="starting",
            expected_generation=placement.generation,
            patch=patch,
        )
        statuses.append(http("GET", manifest, token).status)
        raise transfer_failed("workspace-transfer-failed: gateway returned 404")

    node.before_transfer = probe
    with pytest.raises(WorkerProviderError):
        sync(session)
    assert statuses == [200, 404, 404]


def test_a_file_changed_since_it_was_listed_is_not_served_and_fails_the_sync_clearly(node, worktree):
    session = syncing_session(worktree)
    node.before_transfer = lambda token, params: write(worktree, "README.md", b"edited meanwhile")

    with pytest.raises(WorkerProviderError) as failed:
        sync(session)

    assert failed.value.message == (
        "Worker workspace sync failed: the session's workspace changed while syncing (README.md); retry the dispatch"
    )


def test_a_node_path_through_a_symlink_is_not_followed(node, worktree, tmp_path):
    session = syncing_session(worktree)
    outside = tmp_path / "outside"
    write(outside, "app.py", b"print('hello')\n")  # the same bytes, outside the worktree

    def swap_directory(token: str, params: dict) -> None:
        shutil.rmtree(worktree / "src")
        (worktree / "src").symlink_to(outside)

    node.before_transfer = swap_directory
    with pytest.raises(WorkerProviderError) as failed:
        sync(session)
    assert "changed while syncing (src/" in failed.value.message


def test_the_nodes_transfer_failure_is_reported_with_its_stage(node, worktree):
    session = syncing_session(worktree)

    def fail(token: str, params: dict) -> None:
        raise transfer_failed(
            "workspace-transfer-failed: operation=download stage=verify: materialized a different manifest"
        )

    node.before_transfer = fail
    with pytest.raises(WorkerProviderError) as failed:
        sync(session)
    assert failed.value.message == (
        "Worker workspace sync failed: workspace-transfer-failed: operation=download stage=verify: "
        "materialized a different manifest (WORKSPACE_TRANSFER_FAILED)"
    )


@pytest.mark.parametrize(
    "result",
    [
        None,
        exec_result("/n/1", "sha256:" + "0" * 64 + "\n"),
        {**exec_result("/n/1", "REF\n"), "code": 1},
        {**exec_result("/n/1", "REF\n"), "termination": "timeout"},
        exec_result("relative/dir", "REF\n"),
    ],
    ids=["no result", "another ref", "non-zero exit", "timed out", "relative workspace dir"],
)
def test_a_result_that_does_not_confirm_the_synced_manifest_fails_the_sync(monkeypatch, worktree, result):
    session = syncing_session(worktree)

    def answer(node_id: str, command: str, params: dict, *, timeout_ms: int) -> Any:
        if isinstance(result, dict):
            return {**result, "stdout": result["stdout"].replace("REF", params["transfer"]["manifestRef"])}
        return result

    monkeypatch.setattr(workspace, "call_openclaw", answer)
    with pytest.raises(WorkerProviderError) as failed:
        sync(session)
    assert failed.value.message.startswith("Worker workspace sync failed: the node ")


def test_the_transfer_routes_do_not_wait_behind_the_startup_read_gate(monkeypatch):
    monkeypatch.setattr(state, "serving", lambda: False)

    async def never(timeout_s: float) -> bool:
        raise AssertionError("a transfer route waited for startup")

    monkeypatch.setattr(state, "wait_until_serving", never)
    assert http("GET", f"{BASE}/blobs/{'0' * 64}", "x" * 43).json() == NOT_FOUND


# --- reconcile -----------------------------------------------------------------------------------------


def reconcile(session: Session) -> int:
    placement = Placement.objects.get(pk=session.pk)
    return workspace.reconcile_workspace(NODE, workspace_root(session), session, placement, environment())


def test_a_reconcile_brings_the_nodes_changes_into_the_worktree(node, worktree):
    session = syncing_session(worktree)
    activate(session, sync(session))
    on_node = node.workspace_of(session.session_id)
    write(on_node, "src/app.py", b"print('changed on the node')\n")
    write(on_node, "new/tool.sh", b"#!/bin/sh\nexit 0\n", 0o755)
    (on_node / "README.md").unlink()
    write(worktree, "LOCAL.md", b"written on the gateway meanwhile")

    changed = reconcile(session)

    upload = node.calls[-1]
    assert upload["generation"] == 1 and set(upload["transfer"]) == {
        "direction",
        "token",
        "baseManifestRef",
        "referenceManifestRef",
    }
    assert upload["transfer"]["baseManifestRef"] == upload["transfer"]["referenceManifestRef"]
    assert changed == 3
    assert (worktree / "src/app.py").read_bytes() == b"print('changed on the node')\n"
    assert (worktree / "new/tool.sh").stat().st_mode & 0o777 == 0o755
    assert not (worktree / "README.md").exists()
    assert (worktree / "LOCAL.md").exists() and (worktree / "node_modules/dep/index.js").exists()
    # The upload token was single use.
    token = upload["transfer"]["token"]
    assert http("POST", f"{BASE}/reconciliations/{upload['transfer']['baseManifestRef'][7:]}", token).status == 404


def test_a_refused_upload_leaves_the_worktree_untouched_and_fails_the_move_with_the_reason(node, worktree):
    session = syncing_session(worktree)
    activate(session, sync(session))
    write(node.workspace_of(session.session_id), "src/app.py", b"changed on the node")
    node.upload_body = lambda base, current, files: upload_body(base, current, [b"X" * len(files[0])])

    with pytest.raises(WorkerProviderError) as failed:
        reconcile(session)

    assert failed.value.message == (
        "Worker workspace reconcile failed: the worker node's upload was refused: "
        "an uploaded file's digest differs from its manifest: src/app.py"
    )
    assert (worktree / "src/app.py").read_bytes() == b"print('hello')\n"


def test_an_upload_naming_a_path_outside_the_worktree_is_refused_before_anything_is_written(node, worktree):
    session = syncing_session(worktree)
    activate(session, sync(session))
    hostile = json.dumps(
        {
            "version": 1,
            "baseCommit": None,
            "entries": [{"path": "../escape", "type": "file", "mode": 420, "size": 1, "sha256": "0" * 64}],
        },
        separators=(",", ":"),
    ).encode()
    node.upload_body = lambda base, current, files: upload_body(base, hostile, [])

    with pytest.raises(WorkerProviderError) as failed:
        reconcile(session)

    assert "upload was refused: manifest entry path refused" in failed.value.message
    assert sorted(p.name for p in worktree.parent.iterdir()) == ["node-home", "worktree"]
    assert (worktree / "README.md").exists()


def test_a_reconcile_without_a_worktree_or_a_synced_manifest_asks_the_node_nothing(node):
    session = syncing_session(None)
    activate(session, sync(session))
    calls = len(node.calls)

    assert reconcile(session) == 0
    assert len(node.calls) == calls


# --- the node runtime's dialect branch -----------------------------------------------------------------


def test_the_node_runtime_syncs_and_reconciles_through_transfers_for_a_node_speaking_openclaws_dialect(
    node, worktree, monkeypatch
):
    monkeypatch.setattr(runtime, "node_speaks_openclaw", lambda node_id: node_id == NODE)
    session = syncing_session(worktree)

    synced = node_runtime.sync_workspace(session, Placement.objects.get(pk=session.pk), environment())

    assert synced.remote_workspace_dir == str(node.workspace_of(session.session_id))
    assert node.calls[-1]["transfer"]["direction"] == "download"
    activate(session, synced)
    write(node.workspace_of(session.session_id), "from-node.txt", b"made on the node")
    changed = node_runtime.reconcile_workspace(session, Placement.objects.get(pk=session.pk), environment())
    assert changed == 1 and (worktree / "from-node.txt").read_bytes() == b"made on the node"
    assert node.calls[-1]["transfer"]["direction"] == "upload"


def test_a_move_back_to_the_gateway_reconciles_through_the_transfer_routes(node, worktree, monkeypatch):
    monkeypatch.setattr(runtime, "node_speaks_openclaw", lambda node_id: node_id == NODE)
    # The environment's teardown (worker.environment.stop.v1, then retention) is not this test's subject.
    monkeypatch.setattr(moves, "teardown_environment", lambda environment_id, terminal_state: [])
    session = syncing_session(worktree)
    placement = activate(
        session, node_runtime.sync_workspace(session, Placement.objects.get(pk=session.pk), environment())
    )
    write(node.workspace_of(session.session_id), "src/app.py", b"print('moved back')\n")

    moved = moves.move_session(
        session=session,
        expected_generation=placement.generation,
        expected_environment_id=ENVIRONMENT,
        expected_owner_epoch=1,
        actor=Actor.system("test"),
    )

    assert moved.placement.state == "local"
    assert (worktree / "src/app.py").read_bytes() == b"print('moved back')\n"
    assert node.calls[-1]["transfer"]["direction"] == "upload" and node.calls[-1]["generation"] == 1


def test_a_reset_session_is_reconciled_from_the_workspace_it_was_synced_under(node, worktree):
    session = syncing_session(worktree)
    activate(session, sync(session))
    synced_id = session.session_id
    write(node.workspace_of(synced_id), "src/app.py", b"print('changed before the reset')\n")

    session = session_reset(key=session.key)
    changed = reconcile(session)

    assert session.session_id != synced_id
    assert environment().attached_session_ids == [session.session_id]  # the owner follows the new id
    assert node.calls[-1]["sessionId"] == synced_id and node.calls[-1]["transfer"]["direction"] == "upload"
    assert changed == 1 and (worktree / "src/app.py").read_bytes() == b"print('changed before the reset')\n"


def test_a_workspace_synced_under_another_session_id_fails_the_reconcile_without_asking_the_node(node, worktree):
    session = syncing_session(worktree)
    activate(session, sync(session))
    WorkerEnvironment.objects.filter(pk=ENVIRONMENT).update(workspace_session_id="another-session")
    calls = len(node.calls)

    with pytest.raises(WorkerProviderError) as failed:
        reconcile(session)

    assert failed.value.message == (
        "Worker workspace reconcile failed: the node's workspace is not the one this session was synced to"
    )
    assert len(node.calls) == calls


def test_a_worktree_the_project_cannot_describe_fails_the_sync_before_the_node_is_asked(node, worktree):
    (worktree / "src").joinpath(os.fsdecode(b"latin1-\xe9.txt")).write_bytes(b"not UTF-8 in its name")
    session = syncing_session(worktree)

    with pytest.raises(WorkerProviderError) as failed:
        sync(session)

    assert (
        failed.value.message
        == "session workspace cannot be synced: workspace file cannot be described: path is not valid UTF-8"
    )
    assert node.calls == []


# --- the project dialect's export is bounded ------------------------------------------------------------------


def exporting(monkeypatch, pages: Callable[[int], dict]) -> list[dict]:
    """The project's node answers ``worker.workspace.export.v1`` with ``pages(n)`` for its n-th call."""
    asked: list[dict] = []
    monkeypatch.setattr(runtime, "node_speaks_openclaw", lambda node_id: False)

    def call_node(node_id, command, params, **kwargs):
        asked.append(params)
        return pages(len(asked))

    monkeypatch.setattr(runtime, "call_node", call_node)
    return asked


@pytest.mark.parametrize(
    ("page", "message"),
    [
        (lambda n: {"manifest": [], "hasMore": True, "cursor": f"c{n}"}, "did not end within 5 pages"),
        (lambda n: {"manifest": [], "hasMore": True, "cursor": "same"}, "has more pages but no new cursor"),
        (lambda n: {"manifest": [], "hasMore": True}, "has more pages but no new cursor"),
        (lambda n: {"manifest": [], "blobs": {f"d{n}": "QUJDREVGR0g="}, "hasMore": True, "cursor": f"c{n}"},
         "more than 20 bytes of content"),
        (lambda n: {"manifest": [], "blobs": {"d": 12}, "hasMore": False}, "undecodable workspace content"),
    ],
)  # fmt: skip
def test_a_project_nodes_export_that_never_ends_floods_or_is_malformed_is_refused(worktree, monkeypatch, page, message):
    monkeypatch.setattr(runtime, "EXPORT_MAX_PAGES", 5)
    monkeypatch.setattr(runtime, "MAX_TOTAL_BYTES", 20)
    asked = exporting(monkeypatch, page)
    session = syncing_session(worktree)
    placement = Placement.objects.get(pk=session.pk)
    placement.workspace_base_manifest_ref = "base"

    with pytest.raises(WorkerProviderError, match=message):
        node_runtime.reconcile_workspace(session, placement, environment())

    assert 1 <= len(asked) <= 5
    assert (worktree / "src/app.py").read_bytes() == b"print('hello')\n"
