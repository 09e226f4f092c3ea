"""Workspace sync and reconcile of node workers on real directories (docs/node-worker-protocol.md,
"Paths and content addressing", ``worker.workspace.prepare.v1`` / ``worker.workspace.export.v1``).

* ``apply_workspace_changes``: the node's exported workspace becomes the session's worktree. Its
  content is checked against the manifest's digests, its manifest is validated before anything is
  written, and files the node deleted go only while the worktree still is the synced base.
* ``_blob_batches``: the blobs a node lacks leave in batches bounded by ``SYNC_BATCH_BYTES`` (a
  larger blob alone), read again from the worktree and refused when it changed since the manifest.

A node's export is built here as the node builds it: its manifest, plus the content of every file
whose digest is not in the base manifest.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
from pathlib import Path

import pytest

from openclaw_client.workspace import InvalidManifest, WorkspaceError, build_manifest
from sessions_app.services.sessions import SessionSpec, session_create
from workers_app.models import WorkspaceManifest
from workers_app.nodes import runtime as node_runtime
from workers_app.nodes.retention import MANIFEST_GRACE_MS, workspace_manifests_prune
from workers_app.nodes.runtime import _blob_batches, apply_workspace_changes
from workers_app.providers import WorkerProviderError
from workers_app.services import placements as store
from workers_app.services.placements import now_ms

NO_CONTENT = "worker node exported a workspace without the content of a changed file"
CHANGED_WHILE_SYNCING = "session workspace changed while syncing; retry the dispatch"
BASE = {
    "README.md": b"the base\n",
    "src/app.py": b"print('base')\n",
    "src/util.py": b"def util(): ...\n",
    "run.sh": (b"#!/bin/sh\necho run\n", 0o755),
    "notes.txt": b"to be deleted\n",
}


# --- directories ---------------------------------------------------------------------------------


def write(root: Path, files: dict) -> None:
    for name, spec in files.items():
        data, mode = spec if isinstance(spec, tuple) else (spec, 0o644)
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(mode)


def tree(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every entry under ``root``: files as (content, mode), directories as (b"<dir>", 0)."""
    entries: dict[str, tuple[bytes, int]] = {}
    for path in sorted(root.rglob("*")):
        name = path.relative_to(root).as_posix()
        if path.is_symlink():
            entries[name] = (f"<link to {os.readlink(path)}>".encode(), 0)
        elif path.is_dir():
            entries[name] = (b"<dir>", 0)
        else:
            entries[name] = (path.read_bytes(), path.stat().st_mode & 0o777)
    return entries


def files_of(root: Path) -> dict[str, tuple[bytes, int]]:
    return {name: entry for name, entry in tree(root).items() if entry[0] != b"<dir>"}


@pytest.fixture
def worktree(tmp_path) -> Path:
    root = tmp_path / "worktree"
    root.mkdir()
    write(root, BASE)
    return root


@pytest.fixture
def node_copy(tmp_path, worktree) -> Path:
    """The node's workspace as the sync left it: the worktree's files."""
    copy = tmp_path / "node"
    shutil.copytree(worktree, copy, symlinks=True)
    return copy


def export(node: Path, base: list[dict]) -> tuple[list[dict], dict[str, bytes]]:
    """The node's ``worker.workspace.export.v1`` answer: its manifest and the content new since ``base``."""
    known = {entry["sha256"] for entry in base}
    manifest = build_manifest(node)
    blobs = {entry["sha256"]: (node / entry["path"]).read_bytes() for entry in manifest if entry["sha256"] not in known}
    return manifest, blobs


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def entry(path: str, data: bytes, mode: int = 0o644) -> dict:
    return {"path": path, "sha256": digest(data), "size": len(data), "mode": mode}


# --- apply_workspace_changes: what the node did arrives --------------------------------------------


def test_changed_added_deleted_and_nested_new_files_arrive_and_are_counted(worktree, node_copy):
    base = build_manifest(worktree)
    write(node_copy, {"src/app.py": b"print('changed on the node')\n", "a/b/c/new.txt": b"deep\n", "added.md": b"+\n"})
    (node_copy / "notes.txt").unlink()
    manifest, blobs = export(node_copy, base)

    changed = apply_workspace_changes(worktree, manifest, blobs, base_manifest=base)

    assert changed == 4  # one change, two additions, one deletion
    assert files_of(worktree) == files_of(node_copy)
    assert build_manifest(worktree) == manifest
    assert not [path for path in worktree.rglob("*.openclaw-sync")]


def test_a_mode_only_change_is_applied_without_content(worktree, node_copy):
    """Same digest, other mode: no blob travels (the node sends none) and the mode still changes."""
    base = build_manifest(worktree)
    (node_copy / "run.sh").chmod(0o644)
    (node_copy / "README.md").chmod(0o755)
    manifest, blobs = export(node_copy, base)
    assert blobs == {}

    changed = apply_workspace_changes(worktree, manifest, blobs, base_manifest=base)

    assert changed == 2
    assert (worktree / "run.sh").stat().st_mode & 0o777 == 0o644
    assert (worktree / "README.md").stat().st_mode & 0o777 == 0o755
    assert files_of(worktree) == files_of(node_copy)


def test_an_unchanged_workspace_touches_nothing(worktree, node_copy):
    base = build_manifest(worktree)
    before = {path: path.stat().st_mtime_ns for path in worktree.rglob("*")}
    manifest, blobs = export(node_copy, base)

    assert apply_workspace_changes(worktree, manifest, blobs, base_manifest=base) == 0
    assert {path: path.stat().st_mtime_ns for path in worktree.rglob("*")} == before


@pytest.mark.parametrize("how", ["renamed", "copied"])
def test_a_file_renamed_or_copied_on_the_node_arrives_from_content_the_worktree_has(worktree, node_copy, how):
    base = build_manifest(worktree)
    if how == "renamed":
        (node_copy / "src" / "util.py").rename(node_copy / "src" / "helpers.py")
    else:
        write(node_copy, {"lib/util.py": BASE["src/util.py"]})
    manifest, blobs = export(node_copy, base)
    assert blobs == {}  # the content is in the base: the node sends none

    apply_workspace_changes(worktree, manifest, blobs, base_manifest=base)

    assert files_of(worktree) == files_of(node_copy)


def test_a_worktree_changed_here_keeps_its_own_files_and_takes_the_nodes_changes(worktree, node_copy):
    """Per file: what the gateway added stays; what the node deleted goes where the worktree still holds it
    as synced; the node's changes and additions arrive."""
    base = build_manifest(worktree)
    write(worktree, {"added-on-the-gateway.txt": b"mine\n"})
    write(node_copy, {"src/app.py": b"print('node')\n", "node-new.txt": b"node\n"})
    (node_copy / "notes.txt").unlink()
    (node_copy / "src" / "util.py").unlink()
    manifest, blobs = export(node_copy, base)

    changed = apply_workspace_changes(worktree, manifest, blobs, base_manifest=base)

    assert changed == 4  # the change, the addition, two deletions
    assert files_of(worktree) == {**files_of(node_copy), "added-on-the-gateway.txt": (b"mine\n", 0o644)}


def test_a_file_changed_on_both_sides_takes_the_nodes_version(worktree, node_copy):
    base = build_manifest(worktree)
    write(worktree, {"src/app.py": b"print('gateway')\n"})
    write(node_copy, {"src/app.py": b"print('node')\n"})
    manifest, blobs = export(node_copy, base)

    apply_workspace_changes(worktree, manifest, blobs, base_manifest=base)

    assert (worktree / "src" / "app.py").read_bytes() == b"print('node')\n"


def test_a_file_deleted_on_the_node_but_changed_here_is_kept(worktree, node_copy):
    base = build_manifest(worktree)
    write(worktree, {"notes.txt": b"changed on the gateway\n"})
    (node_copy / "notes.txt").unlink()
    manifest, blobs = export(node_copy, base)

    assert apply_workspace_changes(worktree, manifest, blobs, base_manifest=base) == 0
    assert (worktree / "notes.txt").read_bytes() == b"changed on the gateway\n"


@pytest.mark.parametrize("local_change", ["edited", "deleted"])
def test_a_file_changed_here_and_untouched_on_the_node_keeps_the_gateways_version(worktree, node_copy, local_change):
    base = build_manifest(worktree)
    if local_change == "edited":
        write(worktree, {"src/util.py": b"def util(): return 'edited on the gateway'\n"})
    else:
        (worktree / "src" / "util.py").unlink()
    mine = files_of(worktree).get("src/util.py")
    write(node_copy, {"README.md": b"the node's readme\n"})
    manifest, blobs = export(node_copy, base)

    apply_workspace_changes(worktree, manifest, blobs, base_manifest=base)

    assert files_of(worktree).get("src/util.py") == mine
    assert (worktree / "README.md").read_bytes() == b"the node's readme\n"


@pytest.mark.parametrize("change", ["file becomes a directory", "directory becomes a file"])
def test_a_path_that_changes_between_file_and_directory_is_applied(tmp_path, change):
    worktree, node = tmp_path / "worktree", tmp_path / "node"
    write(
        worktree,
        {"keep.txt": b"k\n", **({"a": b"file\n"} if change == "file becomes a directory" else {"a/x": b"x\n"})},
    )
    base = build_manifest(worktree)
    shutil.copytree(worktree, node)
    if change == "file becomes a directory":
        (node / "a").unlink()
        write(node, {"a/b": b"now a directory\n"})
    else:
        shutil.rmtree(node / "a")
        write(node, {"a": b"now a file\n"})
    manifest, blobs = export(node, base)

    apply_workspace_changes(worktree, manifest, blobs, base_manifest=base)

    assert tree(worktree) == tree(node)


# --- apply_workspace_changes: what is refused ------------------------------------------------------


@pytest.mark.parametrize("conflict", ["a directory with a file of the gateway's own", "a file of the gateway's own"])
def test_a_file_the_worktree_cannot_take_where_it_stands_is_refused_before_anything_changes(tmp_path, conflict):
    """The node turned ``a/`` into a file, or put ``b/c`` under ``b``, while the worktree holds a file of its own
    (made after the sync) there: refused, and the deletes and writes the same export planned are not half-applied."""
    worktree, node = tmp_path / "worktree", tmp_path / "node"
    write(worktree, {"keep.txt": b"k\n", "gone.txt": b"g\n", "a/x": b"x\n"})
    base = build_manifest(worktree)
    shutil.copytree(worktree, node)
    (node / "gone.txt").unlink()
    write(node, {"new.txt": b"new\n"})
    if conflict == "a directory with a file of the gateway's own":
        write(worktree, {"a/mine": b"made here after the sync\n"})
        shutil.rmtree(node / "a")
        write(node, {"a": b"now a file\n"})
    else:
        write(worktree, {"b": b"a file made here\n"})
        write(node, {"b/c": b"under b\n"})
    manifest, blobs = export(node, base)
    before = tree(worktree)

    with pytest.raises(WorkerProviderError, match="the worktree holds"):
        apply_workspace_changes(worktree, manifest, blobs, base_manifest=base)

    assert tree(worktree) == before


@pytest.mark.parametrize("fault", ["other bytes under the digest", "no content at all"])
def test_content_that_does_not_match_its_digest_is_refused_and_that_file_stays_as_it_was(worktree, node_copy, fault):
    base = build_manifest(worktree)
    write(node_copy, {"src/app.py": b"print('node')\n"})
    manifest, blobs = export(node_copy, base)
    [changed_digest] = blobs
    if fault == "other bytes under the digest":
        blobs[changed_digest] = b"print('something else entirely')\n"
    else:
        del blobs[changed_digest]
    before = tree(worktree)

    with pytest.raises(WorkerProviderError) as refused:
        apply_workspace_changes(worktree, manifest, blobs, base_manifest=base)

    assert str(refused.value) == NO_CONTENT
    assert tree(worktree) == before  # the file, and no temporary file beside it


BAD_MANIFESTS = [
    ("../escape.txt", "manifest entry 1: path has an empty, '.' or '..' segment"),
    ("src/../../escape.txt", "manifest entry 1: path has an empty, '.' or '..' segment"),
    ("/tmp/openclaw-reconcile-absolute.txt", "manifest entry 1: path is absolute"),
    ("src//double.txt", "manifest entry 1: path has an empty, '.' or '..' segment"),
    ("nul\x00.txt", "manifest entry 1: path contains NUL"),
    (".git/hooks/post-checkout", "manifest entry 1: path is inside the top-level .git entry"),
]


@pytest.mark.parametrize(("bad_path", "message"), BAD_MANIFESTS, ids=[path for path, _ in BAD_MANIFESTS])
def test_a_manifest_with_an_unsafe_path_is_refused_before_anything_is_written(tmp_path, worktree, bad_path, message):
    """A valid new file comes first: it must not be written either, nor anything outside the root."""
    first = b"a valid new file, listed first\n"
    evil = b"written where it must not be\n"
    manifest = [entry("0-first.txt", first), entry(bad_path, evil)]
    blobs = {digest(first): first, digest(evil): evil}
    outside_before = tree(tmp_path)

    with pytest.raises(InvalidManifest) as refused:
        apply_workspace_changes(worktree, manifest, blobs, base_manifest=build_manifest(worktree))

    assert str(refused.value) == message
    assert tree(tmp_path) == outside_before
    assert not Path("/tmp/openclaw-reconcile-absolute.txt").exists()


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ([entry("b.txt", b"b"), entry("a.txt", b"a")], "manifest entry 1: paths must be sorted and unique"),
        ([entry("a.txt", b"a"), entry("a.txt", b"a")], "manifest entry 1: paths must be sorted and unique"),
        ([entry("a", b"a"), entry("a/b", b"b")], "manifest path 'a/b' is inside a file"),
        ([{**entry("a.txt", b"a"), "mode": 0o777}], "manifest entry 0: mode must be 0o644 (420) or 0o755 (493)"),
        ([{**entry("a.txt", b"a"), "sha256": "A" * 64}], "manifest entry 0: sha256 must be 64 lowercase hex digits"),
        ([{**entry("a.txt", b"a"), "size": -1}], "manifest entry 0: size must be a non-negative integer"),
        (
            [{**entry("a.txt", b"a"), "extra": 1}],
            "manifest entry 0: entry must be an object with exactly path, sha256, size and mode",
        ),
        ({"a.txt": "not a list"}, "manifest must be a list"),
    ],
    ids=["unsorted", "duplicate", "file as parent", "mode", "digest", "size", "extra key", "not a list"],
)
def test_an_invalid_manifest_is_refused_and_the_worktree_is_untouched(tmp_path, worktree, manifest, message):
    blobs = {digest(data): data for data in (b"a", b"b")}
    before = tree(tmp_path)

    with pytest.raises(WorkspaceError) as refused:
        apply_workspace_changes(worktree, manifest, blobs, base_manifest=build_manifest(worktree))

    assert str(refused.value) == message
    assert tree(tmp_path) == before


def test_a_path_through_a_symlinked_directory_of_the_worktree_is_not_written_outside_it(tmp_path, worktree):
    outside = tmp_path / "outside"
    outside.mkdir()
    (worktree / "docs").symlink_to(outside, target_is_directory=True)
    base = build_manifest(worktree)  # the symlink is not workspace content
    data = b"the node created docs/ (it never had the link)\n"
    manifest = sorted([*base, entry("docs/new.md", data)], key=lambda item: item["path"])

    try:
        apply_workspace_changes(worktree, manifest, {digest(data): data}, base_manifest=base)
    except (WorkerProviderError, WorkspaceError, OSError):
        pass  # refusing is fine; writing outside is not

    assert list(outside.iterdir()) == []


# --- _blob_batches -------------------------------------------------------------------------------


def batches_of(root: Path, sizes: list[int], *, limit: int, monkeypatch) -> list[list[int]]:
    """Files of these sizes (distinct content), all wanted in this order; the sizes of each batch."""
    monkeypatch.setattr(node_runtime, "SYNC_BATCH_BYTES", limit)
    by_digest, wanted, size_of = {}, [], {}
    for index, size in enumerate(sizes):
        data = bytes([65 + index]) * size
        (root / f"f{index}").write_bytes(data)
        by_digest[digest(data)] = f"f{index}"
        wanted.append(digest(data))
        size_of[digest(data)] = size
    result = []
    for batch in _blob_batches(root, by_digest, wanted):
        for name, encoded in batch.items():
            assert digest(base64.b64decode(encoded, validate=True)) == name
        result.append([size_of[name] for name in batch])
    assert [name for batch in _blob_batches(root, by_digest, wanted) for name in batch] == wanted
    return result


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        ([4, 4, 4], [[4, 4], [4]]),
        ([5, 5, 5], [[5, 5], [5]]),  # exactly at the limit still shares
        ([3, 25, 3], [[3], [25], [3]]),  # larger than the limit: alone
        ([25, 26], [[25], [26]]),
        ([10], [[10]]),
        ([1, 2, 3, 4], [[1, 2, 3, 4]]),
    ],
)
def test_blob_batches_respect_the_byte_limit_and_send_a_larger_blob_alone(tmp_path, monkeypatch, sizes, expected):
    assert batches_of(tmp_path, sizes, limit=10, monkeypatch=monkeypatch) == expected


def test_blob_batches_hold_at_most_4_mib_of_content(tmp_path, monkeypatch):
    mib = 1024 * 1024
    assert node_runtime.SYNC_BATCH_BYTES == 4 * mib
    assert batches_of(tmp_path, [2 * mib, 2 * mib, 1], limit=4 * mib, monkeypatch=monkeypatch) == [
        [2 * mib, 2 * mib],
        [1],
    ]


def test_no_blobs_wanted_is_no_batch(tmp_path):
    assert list(_blob_batches(tmp_path, {}, [])) == []


def test_a_file_changed_between_manifest_and_read_stops_the_sync(tmp_path, monkeypatch):
    """The manifest promised content the worktree no longer has: the batches completed before went
    out, the changed file (and the batch it would have closed) never does."""
    monkeypatch.setattr(node_runtime, "SYNC_BATCH_BYTES", 10)
    write(tmp_path, {"a.txt": b"a" * 10, "b.txt": b"b" * 10, "c.txt": b"c" * 10})
    manifest = build_manifest(tmp_path)
    by_digest = {item["sha256"]: item["path"] for item in manifest}
    (tmp_path / "c.txt").write_bytes(b"changed meanwhile")

    batches = _blob_batches(tmp_path, by_digest, [item["sha256"] for item in manifest])

    assert list(next(batches)) == [digest(b"a" * 10)]
    with pytest.raises(WorkerProviderError) as changed:
        next(batches)
    assert str(changed.value) == CHANGED_WHILE_SYNCING


@pytest.mark.parametrize("change", ["deleted", "replaced by a directory"])
def test_a_file_gone_between_manifest_and_read_stops_the_sync_with_the_same_message(tmp_path, change):
    write(tmp_path, {"a.txt": b"a"})
    manifest = build_manifest(tmp_path)
    (tmp_path / "a.txt").unlink()
    if change == "replaced by a directory":
        (tmp_path / "a.txt").mkdir()

    with pytest.raises(WorkerProviderError) as changed:
        list(_blob_batches(tmp_path, {manifest[0]["sha256"]: "a.txt"}, [manifest[0]["sha256"]]))

    assert str(changed.value) == CHANGED_WHILE_SYNCING


@pytest.mark.django_db
def test_synced_manifests_are_kept_while_a_placement_names_them_and_pruned_after():
    """The base of a reconcile stays while a placement names it (or while it is fresh: a sync stores it
    before the placement records its ref); the sweep forgets the rest."""
    old = now_ms() - MANIFEST_GRACE_MS - 1
    WorkspaceManifest.objects.create(ref="sha256:" + "1" * 64, manifest=[], created_at_ms=old)
    WorkspaceManifest.objects.create(ref="sha256:" + "2" * 64, manifest=[], created_at_ms=now_ms())
    named = WorkspaceManifest.objects.create(ref="sha256:" + "3" * 64, manifest=[], created_at_ms=old)
    session = session_create(spec=SessionSpec(key="agent:main:manifest-kept", agent_id="main"))
    placement = store.placement_start_dispatch(session=session)
    steps = [
        ("requested", "provisioning", {"environment_id": "worker:manifest-kept"}),
        ("provisioning", "syncing", {"worker_bundle_hash": "a" * 64}),
        ("syncing", "starting", {"workspace_base_manifest_ref": named.ref, "remote_workspace_dir": "/node/ws"}),
    ]
    for from_state, to_state, patch in steps:
        placement = store.placement_transition(
            session=session,
            from_state=from_state,
            to_state=to_state,
            expected_generation=placement.generation,
            patch=patch,
        )

    assert workspace_manifests_prune() == 1
    assert sorted(WorkspaceManifest.objects.values_list("ref", flat=True)) == [
        "sha256:" + "2" * 64,
        "sha256:" + "3" * 64,
    ]
