"""OpenClaw's workspace manifest v1 (``workers_app.nodes.openclaw.manifest``).

The node materializes what the gateway serves, captures it with its own script and requires the same ref, so
the gateway's bytes are compared here with what OpenClaw's own capture script (``REMOTE_WORKSPACE_MANIFEST_JS``
of the npm package the workplace's ``openclaw-cli`` tool installs), run by Node 24, prints for the same tree;
and OpenClaw's own parser must accept them. The rest are the hostile-input rules of an uploaded manifest.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from openclaw_client.workspace import build_manifest
from tests.support.openclaw_cli import node_binary
from tests.support.openclaw_cli import openclaw_dist as tool_dist
from workers_app.nodes.openclaw import manifest as oc

STAGED = "media/inbound/openclaw-staged-" + "ab" * 32


def openclaw_dist() -> Path:
    """The package's built chunks, with Node (installed by the tool when missing; skips without the tool, fails
    under CI)."""
    node_binary()
    return tool_dist()


def chunk(prefix: str) -> Path:
    # Chunk names end in an 8-character content hash: ``workspace-manifest-453LPGpv.mjs``.
    found = sorted(
        p for p in openclaw_dist().glob(f"{prefix}-*.mjs") if re.fullmatch(r"[\w-]{8}\.mjs", p.name[len(prefix) + 1 :])
    )
    assert len(found) == 1, f"expected one {prefix} chunk in OpenClaw's dist, found {found}"
    return found[0]


def node_module_export(module: Path, expression: str, stdin: bytes = b"") -> bytes:
    """What ``expression`` (over the module's exports as ``m``) writes, evaluated by Node 24."""
    program = (
        f"import * as m from {json.dumps(module.as_uri())}; import {{ readFileSync }} from 'node:fs';"
        f"const stdin = () => readFileSync(0, 'utf8'); process.stdout.write(String(await ({expression})));"
    )
    result = subprocess.run(
        [str(node_binary()), "--input-type=module", "-e", program], input=stdin, capture_output=True, timeout=120
    )
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout


def openclaw_capture(root: Path, home: Path) -> bytes:
    """The manifest OpenClaw's node captures of ``root`` after a transfer (its script in ``all`` mode, as
    ``captureManifest`` runs it for a workspace without a Git base): the published bytes, checked against
    the ref it prints."""
    home.mkdir(exist_ok=True)
    script = node_module_export(chunk("workspace-sync-scripts"), "m.n").decode()
    assert "function serializeManifest" in script and "walk(" in script, "not the manifest capture script"
    result = subprocess.run(
        [str(node_binary()), "-e", script, str(root), "", "all"],
        env={"PATH": os.environ["PATH"], "HOME": str(home)},
        capture_output=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr.decode()
    ref = result.stdout.decode().strip()
    published = home / ".openclaw-worker" / "manifests" / f"{ref.removeprefix('sha256:')}.json"
    raw = published.read_bytes()
    assert oc.manifest_ref(raw) == ref
    return raw


def write(root: Path, relative: str, data: bytes, mode: int = 0o644) -> None:
    target = root / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    target.chmod(mode)


PLAIN_TREE = {
    "README.md": (b"# hello\n", 0o644),
    "run.sh": (b"#!/bin/sh\necho hi\n", 0o755),
    "private.key": (b"k", 0o600),
    "tool": (b"\x7fELF", 0o700),
    "src/app.py": (b"print('x')\n", 0o644),
    "src/a.b": (b"", 0o644),
    "src/a/b.txt": (b"slash sorts after dot", 0o644),
    "src/deep/er/est/file.txt": (b"deep", 0o644),
    ".hidden/.env": (b"A=1\n", 0o640),
    "caf\u00e9/\u00e9t\u00e9.txt": (b"unicode", 0o644),
    "\u65e5\u672c/\u8a9e.txt": (b"cjk", 0o644),
    "emoji-\U0001f600.txt": (b"astral: sorts before U+FF5E in UTF-16", 0o644),
    "emoji-\uff5e.txt": (b"BMP above the surrogates", 0o644),
    'quote"name': (b"json escape", 0o644),
    "tab\tand\nnewline": (b"control characters", 0o644),
    "ctl\x01\x1f": (b"escaped as \\u00xx", 0o644),
    "with space/and-dash_under.score": (b"", 0o755),
    # A staged task input keeps derived-looking names (OpenClaw's marker, byte for byte).
    f"{STAGED}/.gitignore": (oc.STAGED_INPUT_MARKER, 0o644),
    f"{STAGED}/node_modules/input.txt": (b"kept", 0o644),
}


@pytest.mark.openclaw_cli
def test_the_gateways_manifest_is_the_bytes_openclaws_node_captures_of_the_same_worktree(tmp_path):
    root = tmp_path / "worktree"
    for relative, (data, mode) in PLAIN_TREE.items():
        write(root, relative, data, mode)
    ours = oc.serialize(oc.transferable_files(build_manifest(root)))

    theirs = openclaw_capture(root, tmp_path / "home")

    assert ours == theirs
    entries = json.loads(ours)["entries"]
    assert f"{STAGED}/node_modules/input.txt" in [entry["path"] for entry in entries]
    assert [e["path"] for e in entries].index("emoji-\U0001f600.txt") < [e["path"] for e in entries].index(
        "emoji-\uff5e.txt"
    )


def materialize(raw: bytes, root: Path, source: Path) -> None:
    """What OpenClaw's node writes for a manifest: its directories, then each file with its mode."""
    root.mkdir()
    for entry in json.loads(raw)["entries"]:
        if entry["type"] == "directory":
            (root / entry["path"]).mkdir(parents=True, exist_ok=True)
        else:
            write(root, entry["path"], (source / entry["path"]).read_bytes(), entry["mode"])


@pytest.mark.openclaw_cli
def test_what_openclaw_cannot_hold_or_would_not_capture_is_left_out_and_the_rest_matches_its_capture(tmp_path):
    root = tmp_path / "worktree"
    write(root, "keep/me.txt", b"kept")
    write(root, "node_modules/pkg/index.js", b"derived")
    write(root, "pkg/__pycache__/m.cpython-312.pyc", b"derived")
    write(root, "pkg/m.pyc", b"derived")
    write(root, "pkg/.DS_Store", b"derived")
    write(root, ".openclaw/sandbox-skills/skill.md", b"managed")
    write(root, ".openclaw/own.md", b"project-owned")
    write(root, "openclaw-inbound-12345678-1234-4123-8123-123456789abc/in.txt", b"attachment")
    write(root, "back\\slash.txt", b"OpenClaw refuses backslashes")
    write(root, ".git/config", b"[core]")
    (root / "empty-dir").mkdir()
    (root / "keep" / "link").symlink_to("me.txt")
    os.mkfifo(root / "fifo")

    ours = oc.serialize(oc.transferable_files(build_manifest(root)))
    paths = [entry["path"] for entry in json.loads(ours)["entries"]]
    assert paths == [".openclaw", ".openclaw/own.md", "keep", "keep/me.txt"]

    materialized = tmp_path / "materialized"
    materialize(ours, materialized, root)
    assert openclaw_capture(materialized, tmp_path / "home") == ours
    # OpenClaw's own parser takes the bytes under their ref.
    parse = f"JSON.stringify(m.o(stdin(), {json.dumps(oc.manifest_ref(ours))}))"
    parsed = json.loads(node_module_export(chunk("workspace-manifest"), parse, stdin=ours))
    assert parsed["directories"] == [".openclaw", "keep"]
    assert [entry["path"] for entry in parsed["entries"]] == [".openclaw/own.md", "keep/me.txt"]


@pytest.mark.openclaw_cli
def test_an_empty_workspace_is_openclaws_empty_manifest(tmp_path):
    ours = oc.serialize([])
    assert ours == b'{"version":1,"baseCommit":null,"entries":[]}'
    (tmp_path / "empty").mkdir()
    assert openclaw_capture(tmp_path / "empty", tmp_path / "home") == ours
