"""The binary reconcile upload of OpenClaw's node (``workers_app.nodes.openclaw.upload``): what a well-formed body
yields, and every malformed or hostile body refused with OpenClaw's limit or reason, before anything is kept
where the body's manifests already say it is wrong."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from workers_app.nodes.openclaw import manifest as oc
from workers_app.nodes.openclaw.upload import (
    CONTENT_TYPE,
    MAX_UPLOAD_BYTES,
    TransferInvalid,
    TransferTooLarge,
    read_upload,
)


def entry(path: str, data: bytes, mode: int = 0o644) -> dict:
    return {"path": path, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "mode": mode}


def raw_manifest(entries: list[dict]) -> bytes:
    """A manifest v1 exactly as given (for hostile shapes the serializer would never make)."""
    return json.dumps({"version": 1, "baseCommit": None, "entries": entries}, separators=(",", ":")).encode()


def body(base: bytes, current: bytes, files: list[bytes], *, sizes: list[int] | None = None) -> bytes:
    parts = [len(base).to_bytes(4, "big"), base, len(current).to_bytes(4, "big"), current]
    for index, data in enumerate(files):
        parts += [(sizes[index] if sizes else len(data)).to_bytes(8, "big"), data]
    return b"".join(parts)


def chunked(data: bytes, size: int = 7):
    """The body as a reader answers it: small chunks, then b"" at the end."""
    pieces = iter([data[i : i + size] for i in range(0, len(data), size)])
    return lambda: next(pieces, b"")


BASE_FILES = [entry("a.txt", b"alpha"), entry("dir/b.txt", b"bravo"), entry("gone.txt", b"deleted on the node")]
BASE = oc.serialize(BASE_FILES)
BASE_REF = oc.manifest_ref(BASE)
CURRENT_FILES = [
    entry("a.txt", b"alpha"),  # unchanged: no bytes travel
    entry("dir/b.txt", b"bravo, changed"),
    entry("new/c.sh", b"#!/bin/sh\n", 0o755),
    entry("new/same-as-c.sh", b"#!/bin/sh\n", 0o755),
]
CURRENT = oc.serialize(CURRENT_FILES)
CHANGED = [b"bravo, changed", b"#!/bin/sh\n", b"#!/bin/sh\n"]


def read(
    data: bytes,
    staging: Path,
    *,
    content_length: int | None = -1,
    base_ref: str = BASE_REF,
    content_type: str = CONTENT_TYPE,
):
    length = len(data) if content_length == -1 else content_length
    return read_upload(
        chunked(data), content_type=content_type, content_length=length, base_ref=base_ref, staging=staging
    )


def test_a_well_formed_upload_yields_both_manifests_and_the_changed_files_verified(tmp_path):
    upload = read(body(BASE, CURRENT, CHANGED), tmp_path)

    assert upload.base.ref == BASE_REF and upload.current.ref == oc.manifest_ref(CURRENT)
    assert upload.current.files() == sorted(CURRENT_FILES, key=lambda e: e["path"])
    assert upload.blobs() == {hashlib.sha256(data).hexdigest(): data for data in CHANGED}
    assert sorted(path.name for path in tmp_path.iterdir()) == ["0", "1", "2"]  # staged by index, not by path


def test_a_node_symlink_is_checked_then_left_out_of_the_files(tmp_path):
    current = raw_manifest(
        [file_entry("a.txt", b"alpha"), {"path": "link", "type": "symlink", "mode": 511, "target": "a.txt"}]
    )
    upload = read(body(BASE, current, []), tmp_path)
    assert [e["path"] for e in upload.current.files()] == ["a.txt"]


@pytest.mark.parametrize(
    "content_length",
    [None, 7, MAX_UPLOAD_BYTES + 1],
    ids=["no content-length (chunked)", "shorter than any upload", "past the byte limit"],
)
def test_an_upload_without_a_length_within_bounds_is_refused_as_too_large(tmp_path, content_length):
    with pytest.raises(TransferTooLarge):
        read(body(BASE, CURRENT, CHANGED), tmp_path, content_length=content_length)


@pytest.mark.parametrize("declared", [1, oc.MAX_MANIFEST_BYTES + 1])
def test_a_manifest_length_outside_its_bounds_is_too_large_before_it_is_read(tmp_path, declared):
    with pytest.raises(TransferTooLarge):
        read(declared.to_bytes(4, "big") + b"{}", tmp_path, content_length=1000)


def test_a_base_that_is_not_the_synced_manifest_is_refused(tmp_path):
    other = oc.serialize([entry("a.txt", b"something else")])
    with pytest.raises(TransferInvalid) as refused:
        read(body(other, CURRENT, CHANGED), tmp_path)
    assert refused.value.reason == "manifest"


def file_entry(path: str, data: bytes = b"x") -> dict:
    return {"path": path, "type": "file", "mode": 420, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@pytest.mark.parametrize(
    "current",
    [
        b"not json",
        b"\xff\xfe",
        json.dumps({"version": 2, "baseCommit": None, "entries": []}).encode(),
        json.dumps({"version": True, "baseCommit": None, "entries": []}).encode(),
        json.dumps({"version": 1, "baseCommit": "a" * 40, "entries": []}).encode(),
        json.dumps([]).encode(),
        raw_manifest([file_entry("../escape")]),
        raw_manifest([file_entry("/etc/passwd")]),
        raw_manifest([{"path": ".git", "type": "directory", "mode": 448}, file_entry(".git/config")]),
        raw_manifest([file_entry("back\\slash")]),
        raw_manifest([file_entry("a//b")]),
        raw_manifest([file_entry("b"), file_entry("a")]),
        raw_manifest([file_entry("a"), file_entry("a")]),
        raw_manifest([file_entry("dir/a")]),  # its parent is not listed as a directory
        raw_manifest([file_entry("dir"), file_entry("dir/a")]),  # its parent is a file
        raw_manifest([{**file_entry("a"), "size": -1}]),
        raw_manifest([{**file_entry("a"), "size": 2**53}]),
        raw_manifest([{**file_entry("a"), "size": 1.5}]),
        raw_manifest([{**file_entry("a"), "sha256": "A" * 64}]),
        raw_manifest([{**file_entry("a"), "mode": 0o1000}]),
        raw_manifest([{**file_entry("a"), "type": "fifo"}]),
        raw_manifest([{"path": "l", "type": "symlink", "mode": 511, "target": "../../outside"}]),
        raw_manifest([{"path": "l", "type": "symlink", "mode": 511, "target": "/etc/passwd"}]),
        raw_manifest([{"path": "l", "type": "symlink", "mode": 511, "target": "C:\\x"}]),
        b'{"version":1,"baseCommit":null,"entries":[{"path":"a","type":"file","mode":420,"size":NaN}]}',
    ],
    ids=lambda value: value[:60].decode("utf-8", "replace"),
)
def test_a_current_manifest_that_is_not_manifest_v1_or_names_an_unsafe_path_is_refused(tmp_path, current):
    with pytest.raises(TransferInvalid) as refused:
        read(body(BASE, current, []), tmp_path)
    assert refused.value.reason == "manifest"
    assert list(tmp_path.iterdir()) == []


def test_a_manifest_declaring_more_than_a_reconcile_may_carry_is_refused_before_any_file_is_read(tmp_path):
    huge = {"path": "big.bin", "type": "file", "mode": 420, "size": oc.MAX_RECONCILIATION_FILE_BYTES + 1}
    current = raw_manifest([{**huge, "sha256": "0" * 64}])
    with pytest.raises(TransferTooLarge):
        read(body(BASE, current, []), tmp_path, content_length=100_000)
    assert list(tmp_path.iterdir()) == []


def test_a_file_whose_size_is_not_its_manifests_is_refused(tmp_path):
    with pytest.raises(TransferInvalid) as refused:
        read(body(BASE, CURRENT, CHANGED, sizes=[len(CHANGED[0]) + 1, 10, 10]), tmp_path)
    assert refused.value.reason == "file_size"


def test_a_file_whose_bytes_are_not_its_digest_is_refused(tmp_path):
    with pytest.raises(TransferInvalid) as refused:
        read(body(BASE, CURRENT, [b"bravo, CHANGED", *CHANGED[1:]]), tmp_path)
    assert refused.value.reason == "file_digest"


@pytest.mark.parametrize("cut", [3, len(BASE) + 6, -5], ids=["in a length", "in a manifest", "in a file"])
def test_a_body_that_ends_early_is_refused(tmp_path, cut):
    whole = body(BASE, CURRENT, CHANGED)
    with pytest.raises(TransferInvalid) as refused:
        read(whole[:cut], tmp_path, content_length=len(whole))
    assert refused.value.reason == "premature_eof"


def test_bytes_after_the_last_file_are_refused(tmp_path):
    with pytest.raises(TransferInvalid) as refused:
        read(body(BASE, CURRENT, CHANGED) + b"extra", tmp_path)
    assert refused.value.reason == "trailing_bytes"


def test_a_body_shorter_than_its_declared_length_is_refused(tmp_path):
    data = body(BASE, CURRENT, CHANGED)
    with pytest.raises(TransferInvalid) as refused:
        read(data, tmp_path, content_length=len(data) + 10)
    assert refused.value.reason == "content_length"


def test_a_reader_answering_text_is_refused(tmp_path):
    with pytest.raises(TransferInvalid) as refused:
        read_upload(lambda: "text", content_type=CONTENT_TYPE, content_length=100, base_ref=BASE_REF, staging=tmp_path)
    assert refused.value.reason == "payload"


@pytest.mark.parametrize("content_type", ["", "application/octet-stream", "application/json"])
def test_a_body_of_another_content_type_is_refused(tmp_path, content_type):
    with pytest.raises(TransferInvalid) as refused:
        read(body(BASE, CURRENT, CHANGED), tmp_path, content_type=content_type)
    assert refused.value.reason == "payload"


def test_the_content_type_may_carry_parameters(tmp_path):
    upload = read(body(BASE, CURRENT, CHANGED), tmp_path, content_type=CONTENT_TYPE + "; charset=binary")
    assert upload.current.ref == oc.manifest_ref(CURRENT)
