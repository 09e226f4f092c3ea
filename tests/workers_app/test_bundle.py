"""The worker bundle (workers.md §5.3): reproducible bytes named by their sha256, served to paired nodes
by their own device token (and to operators by the gateway token), only the current build."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile

import pytest
from django.utils import timezone

from devices_app.models import DeviceToken, PairedDevice
from gateway import scopes as sc
from gateway.auth import hash_device_token
from workers_app.bundle import (
    LOCK_FILE,
    MANIFEST_NAME,
    REQUIREMENTS_NAME,
    RUNTIME_PACKAGES,
    SOURCE_ROOT,
    bundle_bytes,
    current_bundle,
    runtime_requirements,
)

pytestmark = pytest.mark.django_db


def members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        return {member.name: member for member in archive.getmembers()}


def test_the_same_sources_give_the_same_bytes():
    first, second = bundle_bytes(), bundle_bytes()
    assert first == second
    entries = members(first)
    assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 and not m.uname for m in entries.values())
    assert "openclaw_client/client.py" in entries
    assert not any("__pycache__" in name or name.endswith(".pyc") for name in entries)


def test_the_manifest_names_the_version_entry_point_and_every_file():
    data = bundle_bytes(version="2026.9.6-django")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        manifest = json.load(archive.extractfile(MANIFEST_NAME))
        requirements = archive.extractfile(REQUIREMENTS_NAME).read().decode()
        names = [m.name for m in archive.getmembers() if m.name not in (MANIFEST_NAME, REQUIREMENTS_NAME)]
    assert (manifest["name"], manifest["version"], manifest["entry"], manifest["requirements"]) == (
        "openclaw-worker",
        "2026.9.6-django",
        "openclaw_client.node",
        REQUIREMENTS_NAME,
    )
    assert manifest["files"] == names
    assert all(name.startswith("openclaw_client/") for name in names)
    # What the node host needs besides the standard library, pinned with hashes as in the lock.
    pinned = [line.split("==")[0] for line in requirements.splitlines() if "==" in line]
    assert sorted(pinned) == sorted(RUNTIME_PACKAGES)
    assert requirements.count("--hash=sha256:") >= len(RUNTIME_PACKAGES)


def test_a_lock_without_a_runtime_package_is_refused(tmp_path):
    lock = tmp_path / "requirements.lock"
    lock.write_text("websockets==17.4 \\\n    --hash=sha256:" + "0" * 64 + "\n", encoding="utf-8")
    with pytest.raises(RuntimeError, match="does not pin"):
        runtime_requirements(lock)


def test_a_changed_source_is_another_bundle(tmp_path):
    shutil.copytree(
        SOURCE_ROOT / "openclaw_client", tmp_path / "openclaw_client", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(LOCK_FILE, tmp_path / LOCK_FILE.name)
    before = hashlib.sha256(bundle_bytes(tmp_path)).hexdigest()
    (tmp_path / "openclaw_client" / "__init__.py").write_text("# changed\n", encoding="utf-8")
    assert hashlib.sha256(bundle_bytes(tmp_path)).hexdigest() != before


def test_the_current_bundle_is_kept_under_its_name(settings, tmp_path):
    settings.STATE_DIR = tmp_path
    current_bundle.cache_clear()
    try:
        bundle = current_bundle()
        assert bundle.path == tmp_path / "worker-bundles" / f"{bundle.sha256}.tar.gz"
        assert hashlib.sha256(bundle.path.read_bytes()).hexdigest() == bundle.sha256
    finally:
        current_bundle.cache_clear()


def node_token(*, role: str = sc.ROLE_NODE, revoked: bool = False) -> str:
    device = PairedDevice.objects.create(
        device_id="e" * 64,
        public_key="pk",
        display_name="node",
        platform="linux",
        roles=[sc.ROLE_NODE],
        approved_scopes=[],
        approved_at=timezone.now(),
    )
    token = f"device-token-{role}-{revoked}"
    DeviceToken.objects.create(
        device=device,
        role=role,
        token_hash=hash_device_token(token),
        revoked_at=timezone.now() if revoked else None,
    )
    return token


def get(client, path: str, token: str | None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return client.get(path, headers=headers)


def test_a_node_downloads_the_bundle_by_its_name_with_its_device_token(client):
    token = node_token()
    described = get(client, "/api/workers/bundle", token).json()
    downloaded = get(client, f"/api/workers/bundle/{described['sha256']}", token)

    body = b"".join(downloaded.streaming_content)
    assert downloaded.status_code == 200 and downloaded["Content-Type"] == "application/gzip"
    assert hashlib.sha256(body).hexdigest() == described["sha256"] and len(body) == described["size"]
    assert downloaded["ETag"] == f'"{described["sha256"]}"'


def test_an_operator_may_fetch_it_with_the_gateway_token(client, api_token):
    assert get(client, "/api/workers/bundle", api_token).status_code == 200


@pytest.mark.parametrize("who", ["nobody", "revoked node", "operator device", "wrong token"])
def test_anyone_else_is_refused(client, who):
    token = {
        "nobody": None,
        "revoked node": lambda: node_token(revoked=True),
        "operator device": lambda: node_token(role=sc.ROLE_OPERATOR),
        "wrong token": "not-a-token",
    }[who]
    token = token() if callable(token) else token
    answer = get(client, "/api/workers/bundle", token)
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "INVALID_REQUEST"


def test_only_the_current_build_is_served(client):
    token = node_token()
    answer = get(client, f"/api/workers/bundle/{'0' * 64}", token)
    assert answer.status_code == 404
    assert answer.json()["error"]["message"] == f"worker bundle not found: {'0' * 64}"
