"""The worker bundle in OpenClaw's format and its download route (node-worker-dialect.md §1.3, §3.3): the manifest
hash as OpenClaw computes it, an archive of plain files OpenClaw's node accepts, and a route that serves the
bundle once per install token and answers everything else with the same opaque 404."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import json
import subprocess
import tarfile

import pytest

from gateway import state
from openclaw_site.asgi import http_application
from tests.support.openclaw_cli import node_binary, openclaw_dist
from workers_app.nodes.openclaw import bundle as bundle_module
from workers_app.nodes.openclaw.bundle import (
    PROTOCOL_FEATURES,
    BundleFile,
    build_bundle,
    bundle_files,
    manifest_hash,
    openclaw_bundle,
    tarball_bytes,
)
from workers_app.nodes.openclaw.bundle_http import BUNDLE_TOKEN_PURPOSE, bundle_transfer_app, bundle_transfer_path
from workers_app.nodes.openclaw.tokens import transfer_token_mint, transfer_token_revoke


def files(**contents: str) -> list[BundleFile]:
    listed = [
        BundleFile(path=name.replace("_", "."), mode=0o600, data=data.encode()) for name, data in contents.items()
    ]
    return sorted(listed, key=lambda file: file.path)


def test_the_manifest_hash_is_openclaw_s():
    # hashWorkerBundleManifest of these three entries, computed by OpenClaw 2026.9.6's own code.
    entries = [
        BundleFile("tools.mjs", 0o600, b"export const x = 1;\n"),
        BundleFile("worker.mjs", 0o600, b"process.exit(0);\n"),
        BundleFile("z.mjs", 0o700, b""),
    ]
    assert manifest_hash(entries) == "562072392047a3946f1f65248f2e988ab7d4dc5cbddc15f81ab74a24b7137c2e"


def test_the_bundle_is_the_folder_s_mjs_files_as_plain_root_entries(tmp_path):
    (tmp_path / "worker.mjs").write_text("process.exit(0);\n")
    (tmp_path / "tools.mjs").write_text("export {};\n")
    (tmp_path / "notes.md").write_text("not packed")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "worker.test.mjs").write_text("not packed")
    (tmp_path / "linked.mjs").symlink_to(tmp_path / "tools.mjs")
    (tmp_path / "tools.mjs").chmod(0o755)

    built = build_bundle(tmp_path, tmp_path / "out")

    data = built.path.read_bytes()
    assert (len(data), hashlib.sha256(data).hexdigest()) == (built.tarball_bytes, built.tarball_sha256)
    assert gzip.decompress(data)  # a gzip stream
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        members = archive.getmembers()
        assert [member.name for member in members] == ["tools.mjs", "worker.mjs"]
        assert all(member.isreg() for member in members)  # no directory entries
        assert {(member.mode, member.mtime, member.uid, member.gid, member.uname) for member in members} == {
            (0o600, 0, 0, 0, "")
        }
        assert archive.extractfile("worker.mjs").read() == b"process.exit(0);\n"
    assert built.bundle_hash == manifest_hash(bundle_files(tmp_path))
    assert built.build() == {
        "bundleHash": built.bundle_hash,
        "openclawVersion": built.openclaw_version,
        "protocolFeatures": list(PROTOCOL_FEATURES),
    }
    assert built.openclaw_version.endswith(f"+{built.bundle_hash[:12]}")


def test_the_same_sources_give_the_same_bytes_and_other_sources_another_name(tmp_path):
    first = files(worker_mjs="process.exit(0);\n", tools_mjs="export {};\n")
    assert tarball_bytes(first) == tarball_bytes(list(first))
    changed = files(worker_mjs="process.exit(0);\n", tools_mjs="export { x };\n")
    assert manifest_hash(changed) != manifest_hash(first)


def test_a_folder_without_the_entry_is_not_a_bundle(tmp_path):
    (tmp_path / "tools.mjs").write_text("export {};\n")
    with pytest.raises(RuntimeError, match=r"has no worker\.mjs"):
        bundle_files(tmp_path)


def test_openclaw_s_node_accepts_the_shipped_bundle(tmp_path):
    """OpenClaw's own archive reader and extractor (the node's install path) take the bundle and name it by the
    same hash."""
    node = node_binary()
    built = openclaw_bundle()
    [archive_module] = openclaw_dist().glob("worker-bundle-archive-*.mjs")
    script = f"""
const {{ n: readManifest, t: extract }} = await import({json.dumps(str(archive_module))});
const limits = {{ maxEntries: 64, maxExpandedBytes: 1 << 30 }};
const manifest = await readManifest(process.argv[1], limits);
const [tarballPath, destination, expectedBundleHash] = process.argv.slice(1);
await extract({{ tarballPath, destination, expectedBundleHash, limits }});
console.log(JSON.stringify(manifest));
"""
    done = subprocess.run(
        [str(node), "--input-type=module", "-e", script, str(built.path), str(tmp_path / "x"), built.bundle_hash],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert [entry["path"] for entry in listed] == [file.path for file in bundle_files()]
    assert (tmp_path / "x" / "worker.mjs").read_bytes() == (bundle_module.WORKER_SOURCE / "worker.mjs").read_bytes()


# --- the download route ------------------------------------------------------------------------------


def scope_for(path: str, *, authorization: str | None, method: str = "GET") -> dict:
    headers = [(b"host", b"127.0.0.1")]
    if authorization is not None:
        headers.append((b"authorization", authorization.encode()))
    return {"type": "http", "method": method, "path": path, "headers": headers, "query_string": b""}


async def serve(scope: dict, app=bundle_transfer_app) -> dict:
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return {
        "status": sent[0]["status"],
        "headers": {name.decode(): value.decode() for name, value in sent[0]["headers"]},
        "body": b"".join(message.get("body", b"") for message in sent[1:]),
    }


def request(path: str, *, token: str | None = None, method: str = "GET", app=bundle_transfer_app) -> dict:
    authorization = f"Bearer {token}" if token is not None else None
    return asyncio.run(serve(scope_for(path, authorization=authorization, method=method), app))


def install_token(bundle_hash: str | None = None) -> str:
    subject = bundle_hash or openclaw_bundle().bundle_hash
    return transfer_token_mint(BUNDLE_TOKEN_PURPOSE, subject, ttl_s=60, single_use=True)


def assert_opaque_not_found(answer: dict) -> None:
    assert answer["status"] == 404
    assert json.loads(answer["body"]) == {"error": "not_found"}
    assert answer["headers"]["cache-control"] == "no-store"
    assert answer["headers"]["content-length"] == str(len(answer["body"]))


def test_a_current_install_token_downloads_the_exact_bytes_once():
    built = openclaw_bundle()
    token = install_token()
    answer = request(bundle_transfer_path(built.bundle_hash), token=token)
    assert answer["status"] == 200
    assert answer["body"] == built.path.read_bytes()
    assert answer["headers"]["content-length"] == str(built.tarball_bytes) == str(len(answer["body"]))
    assert answer["headers"]["x-openclaw-content-sha256"] == built.tarball_sha256
    assert answer["headers"]["cache-control"] == "no-store"
    assert_opaque_not_found(request(bundle_transfer_path(built.bundle_hash), token=token))  # single use


@pytest.mark.parametrize(
    "case",
    [
        "no token",
        "unknown token",
        "malformed token",
        "other scheme",
        "revoked token",
        "token of another bundle",
        "token of another purpose",
        "another hash",
        "HEAD",
        "POST",
    ],
)
def test_anything_else_is_the_same_opaque_not_found(case):
    built = openclaw_bundle()
    path = bundle_transfer_path(built.bundle_hash)
    token = install_token()
    if case == "no token":
        answer = request(path)
    elif case == "unknown token":
        answer = request(path, token="A" * 43)
    elif case == "malformed token":
        answer = request(path, token=token + "x")
    elif case == "other scheme":
        answer = asyncio.run(serve(scope_for(path, authorization=f"Basic {token}")))
    elif case == "revoked token":
        transfer_token_revoke(token)
        answer = request(path, token=token)
    elif case == "token of another bundle":
        answer = request(path, token=install_token("f" * 64))
    elif case == "token of another purpose":
        other = transfer_token_mint("workspace-download", built.bundle_hash, ttl_s=60, single_use=True)
        answer = request(path, token=other)
    elif case == "another hash":
        answer = request(bundle_transfer_path("f" * 64), token=install_token("f" * 64))
    else:
        answer = request(path, token=token, method=case)
    assert_opaque_not_found(answer)
    if case in ("HEAD", "POST", "other scheme", "malformed token"):
        # A refused request does not use the token up.
        assert request(path, token=token)["status"] == 200


def test_of_concurrent_downloads_with_one_token_exactly_one_is_served():
    built = openclaw_bundle()
    token = install_token()
    path = bundle_transfer_path(built.bundle_hash)

    async def one() -> int:
        return (await serve(scope_for(path, authorization=f"Bearer {token}")))["status"]

    async def race() -> list[int]:
        return await asyncio.gather(*(one() for _ in range(8)))

    assert sorted(asyncio.run(race())) == [200] + [404] * 7


def test_the_route_is_served_beside_django_and_never_waits_for_startup(monkeypatch):
    async def never(timeout_s: float) -> bool:
        raise AssertionError("the bundle route waited behind the startup gate")

    monkeypatch.setattr(state, "serving", lambda: False)
    monkeypatch.setattr(state, "wait_until_serving", never)
    built = openclaw_bundle()
    answer = request(bundle_transfer_path(built.bundle_hash), token=install_token(), app=http_application)
    assert answer["status"] == 200 and answer["body"] == built.path.read_bytes()
    assert_opaque_not_found(request(bundle_transfer_path(built.bundle_hash), app=http_application))
