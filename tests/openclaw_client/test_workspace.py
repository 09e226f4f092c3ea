"""Workspace manifests, the blob store and materialization (``openclaw_client.workspace``), on real files."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import socket
from pathlib import Path

import pytest

from openclaw_client import workspace as ws
from openclaw_client.workspace import (
    BlobMismatch,
    BlobMissing,
    BlobStore,
    InvalidManifest,
    WorkspaceError,
    build_manifest,
    changed_digests,
    decode_blobs,
    encode_blobs,
    export_page,
    manifest_ref,
    materialize,
    path_problem,
    snapshot,
    validate_manifest,
)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write(root: Path, relative: str, data: bytes, mode: int = 0o644) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.chmod(path, mode)


def entry(path: str, data: bytes = b"x", mode: int = 0o644) -> dict:
    return {"path": path, "sha256": sha(data), "size": len(data), "mode": mode}


# --- build_manifest -------------------------------------------------------------------------------


def test_a_manifest_lists_regular_files_sorted_with_digest_size_and_normalized_mode(tmp_path):
    write(tmp_path, "b.txt", b"bee")
    write(tmp_path, "a/run.sh", b"#!/bin/sh\n", 0o700)
    write(tmp_path, "a/z/deep.md", b"", 0o600)

    assert build_manifest(tmp_path) == [
        {"path": "a/run.sh", "sha256": sha(b"#!/bin/sh\n"), "size": 10, "mode": 0o755},
        {"path": "a/z/deep.md", "sha256": sha(b""), "size": 0, "mode": 0o644},
        {"path": "b.txt", "sha256": sha(b"bee"), "size": 3, "mode": 0o644},
    ]


def test_symlinks_sockets_and_the_top_level_git_entry_are_not_workspace_content(tmp_path):
    write(tmp_path, "kept.txt", b"kept")
    write(tmp_path, ".git/config", b"[core]")
    write(tmp_path, "sub/.git", b"gitdir: elsewhere")  # only the top-level .git is left out
    (tmp_path / "link.txt").symlink_to(tmp_path / "kept.txt")
    (tmp_path / "linked-dir").symlink_to(tmp_path / "sub", target_is_directory=True)
    listener = socket.socket(socket.AF_UNIX)
    short = Path(f"/tmp/ws-sock-{os.getpid()}")
    try:
        listener.bind(str(short))
        os.rename(short, tmp_path / "agent.sock")
        assert [item["path"] for item in build_manifest(tmp_path)] == ["kept.txt", "sub/.git"]
    finally:
        listener.close()


def test_a_top_level_git_file_is_left_out_too(tmp_path):
    write(tmp_path, ".git", b"gitdir: ../elsewhere")
    write(tmp_path, ".gitignore", b"*.pyc")
    assert [item["path"] for item in build_manifest(tmp_path)] == [".gitignore"]


def test_an_empty_directory_has_an_empty_manifest_and_a_stable_ref(tmp_path):
    assert build_manifest(tmp_path) == []
    assert manifest_ref([]) == "sha256:" + sha(b"[]")


def test_limits_are_enforced_while_building(tmp_path, monkeypatch):
    for index in range(3):
        write(tmp_path, f"f{index}", b"12345")
    monkeypatch.setattr(ws, "MAX_FILES", 2)
    with pytest.raises(WorkspaceError, match="more than 2 files"):
        build_manifest(tmp_path)
    monkeypatch.setattr(ws, "MAX_FILES", 50_000)
    monkeypatch.setattr(ws, "MAX_TOTAL_BYTES", 14)
    with pytest.raises(WorkspaceError, match="larger than 14 bytes"):
        build_manifest(tmp_path)


def test_a_path_longer_than_the_limit_cannot_be_described(tmp_path, monkeypatch):
    write(tmp_path, "a" * 20, b"")
    monkeypatch.setattr(ws, "MAX_PATH_BYTES", 10)
    with pytest.raises(WorkspaceError, match="longer than 10 bytes"):
        build_manifest(tmp_path)


def test_a_file_name_that_is_not_utf8_cannot_be_described(tmp_path):
    (tmp_path / os.fsdecode(b"bad-\xff")).write_bytes(b"x")
    with pytest.raises(WorkspaceError, match="not valid UTF-8"):
        build_manifest(tmp_path)


# --- refs and validation --------------------------------------------------------------------------


def test_the_ref_is_the_sha256_of_the_canonical_json():
    manifest = [entry("a", b"1"), entry("b", b"2", 0o755)]
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    assert manifest_ref(manifest) == "sha256:" + sha(canonical)
    assert manifest_ref(manifest) != manifest_ref([entry("a", b"1"), entry("b", b"2")])  # the mode counts


def test_a_built_manifest_validates(tmp_path):
    write(tmp_path, "x/y.txt", b"y")
    write(tmp_path, "x.txt", b"x")
    manifest = build_manifest(tmp_path)
    assert validate_manifest(manifest) is manifest


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ({"path": "a"}, "manifest must be a list"),
        (["a"], "exactly path, sha256, size and mode"),
        ([{**entry("a"), "extra": 1}], "exactly path, sha256, size and mode"),
        ([entry("../escape")], "'.' or '..' segment"),
        ([entry("a/./b")], "'.' or '..' segment"),
        ([entry("a//b")], "empty"),
        ([entry("/etc/passwd")], "absolute"),
        ([entry("a\x00b")], "NUL"),
        ([entry("")], "non-empty"),
        ([entry(".git/hooks/post-checkout")], ".git"),
        ([{**entry("a"), "sha256": "A" * 64}], "lowercase hex"),
        ([{**entry("a"), "sha256": "ab"}], "lowercase hex"),
        ([{**entry("a"), "size": -1}], "non-negative"),
        ([{**entry("a"), "size": True}], "non-negative"),
        ([{**entry("a"), "size": 1.0}], "non-negative"),
        ([{**entry("a"), "mode": 0o600}], "mode"),
        ([{**entry("a"), "mode": "0644"}], "mode"),
        ([entry("b"), entry("a")], "sorted and unique"),
        ([entry("a"), entry("a")], "sorted and unique"),
        ([entry("a"), entry("a/b")], "inside a file"),
    ],
)
def test_invalid_manifests_are_refused_with_the_reason(manifest, message):
    with pytest.raises(InvalidManifest, match=re.escape(message)):
        validate_manifest(manifest)


def test_validation_enforces_the_limits(monkeypatch):
    monkeypatch.setattr(ws, "MAX_FILES", 1)
    with pytest.raises(InvalidManifest, match="more than 1 files"):
        validate_manifest([entry("a"), entry("b")])
    monkeypatch.setattr(ws, "MAX_FILES", 50_000)
    with pytest.raises(InvalidManifest, match="larger than"):
        validate_manifest([{**entry("a"), "size": ws.MAX_TOTAL_BYTES}, {**entry("b"), "size": 1}])
    with pytest.raises(InvalidManifest, match="longer than 4096 bytes"):
        validate_manifest([entry("é" * 2049)])


def test_path_problem_accepts_ordinary_relative_paths():
    assert path_problem("src/main.py") is None
    assert path_problem("with space/and-dash_.txt") is None
    assert path_problem("..hidden") is None  # a name that starts with dots is not "..": allowed


# --- blob store -----------------------------------------------------------------------------------


def test_the_blob_store_checks_digests_on_the_way_in(tmp_path):
    store = BlobStore(tmp_path / "blobs")
    store.put(sha(b"hello"), b"hello")
    assert store.has(sha(b"hello")) and store.read(sha(b"hello")) == b"hello"
    assert store.path(sha(b"hello")) == tmp_path / "blobs" / sha(b"hello")[:2] / sha(b"hello")
    with pytest.raises(BlobMismatch, match="does not match"):
        store.put(sha(b"hello"), b"goodbye")
    assert store.missing([sha(b"a"), sha(b"hello"), sha(b"a")]) == [sha(b"a")]
    store.put(sha(b"hello"), b"hello")  # idempotent


def test_the_blob_store_refuses_names_that_are_not_digests(tmp_path):
    store = BlobStore(tmp_path)
    for name in ("../../etc/passwd", "A" * 64, "x"):
        with pytest.raises(BlobMismatch):
            store.path(name)


def test_a_damaged_blob_is_detected_when_read(tmp_path):
    store = BlobStore(tmp_path)
    store.put(sha(b"good"), b"good")
    store.path(sha(b"good")).write_bytes(b"evil")
    with pytest.raises(BlobMismatch, match="damaged"):
        store.read(sha(b"good"))
    with pytest.raises(BlobMissing):
        store.read(sha(b"absent"))


def test_put_file_names_the_content_it_copied(tmp_path):
    source = tmp_path / "file"
    source.write_bytes(b"content")
    store = BlobStore(tmp_path / "blobs")
    assert store.put_file(source) == (sha(b"content"), 7)
    assert store.read(sha(b"content")) == b"content"
    assert not [path for path in (tmp_path / "blobs").iterdir() if path.name.startswith(".blob-")]


# --- materialize ----------------------------------------------------------------------------------


def stored(store: BlobStore, *contents: bytes) -> None:
    for data in contents:
        store.put(sha(data), data)


def test_materialize_writes_the_manifest_with_modes(tmp_path):
    store = BlobStore(tmp_path / "blobs")
    stored(store, b"print(1)\n", b"#!/bin/sh\n")
    manifest = [entry("app/main.py", b"print(1)\n"), entry("run.sh", b"#!/bin/sh\n", 0o755)]
    target = tmp_path / "workspaces" / "env-1"
    materialize(manifest, store, target)
    assert (target / "app/main.py").read_bytes() == b"print(1)\n"
    assert os.stat(target / "run.sh").st_mode & 0o777 == 0o755
    assert os.stat(target / "app/main.py").st_mode & 0o777 == 0o644
    assert build_manifest(target) == manifest


def test_materialize_replaces_an_existing_workspace_whole(tmp_path):
    store = BlobStore(tmp_path / "blobs")
    stored(store, b"new")
    target = tmp_path / "workspaces" / "env-1"
    write(target, "old.txt", b"old")
    materialize([entry("new.txt", b"new")], store, target)
    assert sorted(path.name for path in target.iterdir()) == ["new.txt"]
    assert sorted(path.name for path in target.parent.iterdir()) == ["env-1"]  # no staging left


def test_a_failed_materialize_leaves_the_previous_workspace_and_no_staging(tmp_path):
    store = BlobStore(tmp_path / "blobs")
    stored(store, b"present")
    target = tmp_path / "workspaces" / "env-1"
    write(target, "old.txt", b"old")
    with pytest.raises(BlobMissing):
        materialize([entry("a.txt", b"present"), entry("b.txt", b"absent")], store, target)
    assert (target / "old.txt").read_bytes() == b"old"
    assert sorted(path.name for path in target.parent.iterdir()) == ["env-1"]


def test_materialize_refuses_damaged_content(tmp_path):
    store = BlobStore(tmp_path / "blobs")
    stored(store, b"good")
    store.path(sha(b"good")).write_bytes(b"evil")
    with pytest.raises(BlobMismatch):
        materialize([entry("a", b"good")], store, tmp_path / "ws")
    assert not (tmp_path / "ws").exists()


# --- export ---------------------------------------------------------------------------------------


def test_snapshot_stores_the_content_it_describes(tmp_path):
    root = tmp_path / "ws"
    write(root, "a.txt", b"alpha")
    write(root, "b.txt", b"beta")
    store = BlobStore(tmp_path / "blobs")
    manifest = snapshot(root, store)
    assert manifest == build_manifest(root)
    assert all(store.read(item["sha256"]) for item in manifest)


def test_changed_digests_and_pages(tmp_path):
    store = BlobStore(tmp_path / "blobs")
    contents = [b"a" * 5, b"b" * 5, b"c" * 20, b"d" * 1]
    stored(store, *contents)
    manifest = sorted((entry(f"f{index}", data) for index, data in enumerate(contents)), key=lambda e: e["path"])
    base = [entry("f0", contents[0])]
    wanted = changed_digests(manifest, base)
    assert wanted == sorted({sha(data) for data in contents[1:]})
    assert changed_digests(manifest, None) == sorted(sha(data) for data in contents)

    pages, offset = [], 0
    while offset is not None:
        page = export_page(manifest, wanted, store, offset=offset, budget=10)
        pages.append(page.blobs)
        offset = page.next_offset
    assert {digest for page in pages for digest in page} == set(wanted)
    assert all(sum(map(len, page.values())) <= 10 or len(page) == 1 for page in pages)  # a big blob travels alone


def test_blob_maps_round_trip_and_malformed_ones_are_refused():
    blobs = {sha(b"x"): b"x"}
    assert decode_blobs(encode_blobs(blobs)) == blobs
    assert encode_blobs(blobs) == {sha(b"x"): base64.b64encode(b"x").decode()}
    for bad in ([], {"nothex": "eA=="}, {sha(b"x"): 1}, {sha(b"x"): "***"}):
        with pytest.raises(InvalidManifest):
            decode_blobs(bad)
