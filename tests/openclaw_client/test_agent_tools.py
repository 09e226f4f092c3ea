"""The agent's file and search tools (``openclaw_client.agent.tools``) on real files: every path stays inside
the workspace, malformed calls are refused with one line for the model, and each tool's own rules.

``exec`` and the host's command slots are in ``test_agent_exec.py``.
"""

from __future__ import annotations

import ast
import json
import os
import socket
import stat
import sys
import threading
from pathlib import Path

import pytest

from openclaw_client.agent import schema
from openclaw_client.agent.tools import (
    TOOL_NAMES,
    PreparedCall,
    ToolCallError,
    ToolLimits,
    ToolResult,
    ToolRunner,
    Workspace,
    tool_specs,
)

SECRET = "secret outside the workspace"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    directory = tmp_path / "outside"
    directory.mkdir()
    (directory / "secret.txt").write_text(SECRET)
    return directory


@pytest.fixture
def root(tmp_path: Path, outside: Path) -> Path:
    directory = tmp_path / "ws"
    directory.mkdir()
    return directory


def runner_for(root: Path, **limits) -> ToolRunner:
    return ToolRunner(Workspace(root), limits=ToolLimits(**limits))


def call(runner: ToolRunner, name: str, arguments: dict | str, cancel: threading.Event | None = None) -> ToolResult:
    return runner.run(
        runner.prepare(name, arguments if isinstance(arguments, str) else json.dumps(arguments)), cancel=cancel
    )


def ok(runner: ToolRunner, name: str, arguments: dict) -> ToolResult:
    result = call(runner, name, arguments)
    assert not result.is_error, result.text
    return result


def refused(runner: ToolRunner, name: str, arguments: dict) -> str:
    result = call(runner, name, arguments)
    assert result.is_error, result.text
    return result.text


# --- paths: every tool, every way out ------------------------------------------------------------------------


def path_arguments(tool: str, path: str) -> dict:
    return {
        "read": {"path": path},
        "write": {"path": path, "content": "pwned"},
        "edit": {"path": path, "edits": [{"oldText": "secret", "newText": "pwned"}]},
        "ls": {"path": path},
        "find": {"pattern": "*", "path": path},
        "grep": {"pattern": "secret", "path": path},
        "exec": {"command": "cat secret.txt; echo pwned > pwned.txt", "workdir": path},
    }[tool]


def make_escape(case: str, root: Path, outside: Path) -> str:
    """Builds what ``case`` needs in the workspace and returns the path the model names."""
    if case == "dotdot":
        return "../outside/secret.txt"
    if case == "dotdot-inside-first":
        (root / "sub").mkdir()
        return "sub/../../outside/secret.txt"
    if case == "absolute-outside":
        return str(outside / "secret.txt")
    if case == "symlinked-file":
        (root / "link.txt").symlink_to(outside / "secret.txt")
        return "link.txt"
    if case == "symlinked-dir":
        (root / "linkdir").symlink_to(outside)
        return "linkdir/secret.txt"
    if case == "symlinked-dir-itself":
        (root / "linkdir").symlink_to(outside)
        return "linkdir"
    if case == "relative-symlink-chain":
        (root / "a").mkdir()
        (root / "a" / "up").symlink_to("../..")
        return "a/up/outside/secret.txt"
    if case == "dangling-symlink-out":
        (root / "dangling").symlink_to(outside / "not-yet.txt")
        return "dangling"
    if case == "dev-null-symlink":
        (root / "null").symlink_to("/dev/null")
        return "null"
    raise AssertionError(case)


ESCAPES = [
    "dotdot",
    "dotdot-inside-first",
    "absolute-outside",
    "symlinked-file",
    "symlinked-dir",
    "symlinked-dir-itself",
    "relative-symlink-chain",
    "dangling-symlink-out",
    "dev-null-symlink",
]


@pytest.mark.parametrize("tool", TOOL_NAMES)
@pytest.mark.parametrize("case", ESCAPES)
def test_a_path_leading_out_of_the_workspace_is_refused(tool, case, root, outside):
    runner = runner_for(root)
    path = make_escape(case, root, outside)
    before = sorted(p.name for p in outside.iterdir())

    result = call(runner, tool, path_arguments(tool, path))

    assert result.is_error
    assert "outside the workspace" in result.text
    assert SECRET not in result.text
    assert (outside / "secret.txt").read_text() == SECRET
    assert sorted(p.name for p in outside.iterdir()) == before
    assert not (root / "pwned.txt").exists()


def test_exec_request_refuses_a_workdir_outside_the_workspace(root, outside):
    runner = runner_for(root)
    (root / "linkdir").symlink_to(outside)
    for workdir in ("..", str(outside), "linkdir"):
        with pytest.raises(ToolCallError, match="outside the workspace"):
            runner.exec_request(runner.prepare("exec", {"command": "pwd", "workdir": workdir}))


def make_special(kind: str, root: Path) -> str:
    path = root / kind
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("mknod needs CAP_MKNOD")
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        server.close()
    return kind


@pytest.mark.parametrize("tool", TOOL_NAMES)
@pytest.mark.parametrize("kind", ["fifo", "device", "socket"])
def test_a_fifo_device_or_socket_inside_the_workspace_is_never_opened_as_a_file(tool, kind, root):
    runner = runner_for(root)
    name = make_special(kind, root)

    result = call(runner, tool, path_arguments(tool, name))  # a FIFO opened for reading would block here

    assert result.is_error
    assert stat.S_IFMT(os.lstat(root / name).st_mode) != stat.S_IFREG  # not replaced by a write


@pytest.mark.parametrize("kind", ["fifo", "device", "socket"])
def test_read_names_the_kind_of_a_special_file(kind, root):
    runner = runner_for(root)
    name = make_special(kind, root)
    expected = {"fifo": "a FIFO", "device": "a device file", "socket": "a socket"}[kind]
    assert refused(runner, "read", {"path": name}) == f"{name} is {expected}; only regular files can be read or written"


@pytest.mark.parametrize("tool", TOOL_NAMES)
def test_a_path_with_a_nul_byte_is_refused(tool, root):
    result = call(runner_for(root), tool, path_arguments(tool, "a\x00b"))
    assert result.is_error
    assert "NUL byte" in result.text


@pytest.mark.parametrize("tool", TOOL_NAMES)
def test_a_path_over_4096_bytes_is_refused(tool, root):
    runner = runner_for(root)
    key = "workdir" if tool == "exec" else "path"
    with pytest.raises(ToolCallError, match=f'"{key}" is too long'):
        runner.prepare(tool, path_arguments(tool, "a" * 4097))
    # Within the schema's 4096 characters, over 4096 bytes.
    result = call(runner, tool, path_arguments(tool, "é" * 3000))
    assert result.is_error
    assert "longer than 4096 bytes" in result.text


def test_symlinks_that_stay_inside_the_workspace_are_followed(root):
    (root / "real").mkdir()
    (root / "real" / "f.txt").write_text("inside\n")
    (root / "alias").symlink_to("real")
    (root / "f-link").symlink_to("real/f.txt")
    runner = runner_for(root)

    assert ok(runner, "read", {"path": "alias/f.txt"}).text == "inside\n"
    assert ok(runner, "read", {"path": "f-link"}).details["path"] == "real/f.txt"
    ok(runner, "write", {"path": "alias/g.txt", "content": "new"})
    assert (root / "real" / "g.txt").read_text() == "new"


def test_an_absolute_path_inside_a_root_reached_through_a_symlink_is_accepted(tmp_path, root):
    (root / "f.txt").write_text("hello")
    via = tmp_path / "via"
    via.symlink_to(root)
    workspace = Workspace(via)
    runner = ToolRunner(workspace)

    assert workspace.root == root.resolve()
    assert ok(runner, "read", {"path": str(via / "f.txt")}).text == "hello"
    assert ok(runner, "read", {"path": str(root / "f.txt")}).text == "hello"
    (root / "sub").mkdir()
    assert ok(runner, "read", {"path": "sub/../f.txt"}).text == "hello"


def test_a_directory_swapped_for_a_symlink_after_the_check_is_not_followed(root, outside):
    """The TOCTOU window: the path is checked, then a command swaps a directory for a symlink out."""
    workspace = Workspace(root)
    (root / "sub").mkdir()
    (root / "sub" / "secret.txt").write_text("inside")
    reading = workspace.resolve("sub/secret.txt")
    writing = workspace.resolve("sub/new.txt")
    (root / "sub").rename(root / "old-sub")
    (root / "sub").symlink_to(outside)

    with pytest.raises(ToolCallError, match="changed while in use"):
        workspace.open_regular_file(reading)
    with pytest.raises(ToolCallError, match="changed while in use"):
        workspace.write_atomically(writing, b"pwned")
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def test_a_file_swapped_for_a_symlink_after_the_check_is_not_followed(root, outside):
    workspace = Workspace(root)
    (root / "f.txt").write_text("inside")
    checked = workspace.resolve("f.txt")
    (root / "f.txt").unlink()
    (root / "f.txt").symlink_to(outside / "secret.txt")

    with pytest.raises(ToolCallError, match="changed while in use"):
        workspace.open_regular_file(checked)
    with pytest.raises(ToolCallError, match="changed while in use"):
        workspace.write_atomically(checked, b"pwned")
    assert (outside / "secret.txt").read_text() == SECRET


def test_the_workspace_root_must_exist_and_be_a_directory(tmp_path):
    with pytest.raises(FileNotFoundError):
        Workspace(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError):
        Workspace(tmp_path / "file")


# --- prepare: malformed calls -------------------------------------------------------------------------------


MALFORMED = [
    ("read", '{"path": "a\\ud800"}', 'invalid arguments for read: "path" is not valid Unicode text'),
    (
        "write",
        '{"path": "a", "content": "\\udfff"}',
        'invalid arguments for write: "content" is not valid Unicode text',
    ),
    ("exec", '{"command": "echo \\ud800"}', 'invalid arguments for exec: "command" is not valid Unicode text'),
    (
        "exec",
        '{"command": "x", "env": {"A": "\\ud800"}}',
        'invalid arguments for exec: "env.A" is not valid Unicode text',
    ),
    ("read", '{"path": "a", "\\ud800": 1}', 'invalid arguments for read: unknown key "\\\\ud800" in arguments'),
    ("foo", "{}", 'unknown tool "foo"; available: read, write, edit, ls, find, grep, exec'),
    ("read", "{", "invalid arguments for read: not valid JSON (Expecting property name enclosed in double quotes"),
    ("read", '{"path": "a"} trailing', "invalid arguments for read: not valid JSON (Extra data at line 1 column 15)"),
    ("read", '{"path": "a", "offset": NaN}', "invalid arguments for read: not valid JSON (NaN is not a JSON number)"),
    ("read", "[1]", "invalid arguments for read: expected a JSON object, not an array"),
    ("read", '"a.txt"', "invalid arguments for read: expected a JSON object, not a string"),
    ("read", "3", "invalid arguments for read: expected a JSON object, not a number"),
    ("read", "null", "invalid arguments for read: expected a JSON object, not null"),
    ("read", "[" * 100_000 + "]" * 100_000, "invalid arguments for read: nested too deeply"),
    ("read", "{}", 'invalid arguments for read: "path" is required'),
    ("write", '{"path": "a"}', 'invalid arguments for write: "content" is required'),
    ("read", '{"path": 3}', 'invalid arguments for read: "path" must be a string, not a number'),
    ("read", '{"path": "a", "offset": "3"}', 'invalid arguments for read: "offset" must be an integer, not a string'),
    ("read", '{"path": "a", "offset": 1.5}', 'invalid arguments for read: "offset" must be an integer, not a number'),
    ("read", '{"path": "a", "limit": true}', 'invalid arguments for read: "limit" must be an integer, not a boolean'),
    ("read", '{"path": "a", "offset": 0}', 'invalid arguments for read: "offset" must be at least 1'),
    ("read", '{"path": "a", "limit": -5}', 'invalid arguments for read: "limit" must be at least 1'),
    ("ls", '{"limit": 10001}', 'invalid arguments for ls: "limit" must be at most 10000'),
    ("grep", '{"pattern": "x", "context": 21}', 'invalid arguments for grep: "context" must be at most 20'),
    (
        "grep",
        '{"pattern": "x", "ignoreCase": "yes"}',
        'invalid arguments for grep: "ignoreCase" must be a boolean, not a string',
    ),
    (
        "exec",
        '{"command": "x", "timeoutSeconds": 0.5}',
        'invalid arguments for exec: "timeoutSeconds" must be at least 1',
    ),
    (
        "exec",
        '{"command": "x", "timeoutSeconds": 1801}',
        'invalid arguments for exec: "timeoutSeconds" must be at most 1800',
    ),
    (
        "exec",
        '{"command": "x", "timeoutSeconds": "9"}',
        'invalid arguments for exec: "timeoutSeconds" must be a finite number, not a string',
    ),
    (
        "read",
        '{"path": "a", "file": "b"}',
        'invalid arguments for read: unknown key "file" in arguments (allowed: path, offset, limit)',
    ),
    (
        "read",
        '{"file_path": "a"}',
        'invalid arguments for read: unknown key "file_path" in arguments (allowed: path, offset, limit)',
    ),
    ("edit", '{"path": "a", "edits": []}', 'invalid arguments for edit: "edits" must have at least 1 item(s)'),
    (
        "edit",
        '{"path": "a", "edits": {"oldText": "x"}}',
        'invalid arguments for edit: "edits" must be an array, not an object',
    ),
    ("edit", '{"path": "a", "edits": ["x"]}', 'invalid arguments for edit: "edits[0]" must be an object, not a string'),
    (
        "edit",
        '{"path": "a", "edits": [{"oldText": "x"}]}',
        'invalid arguments for edit: "edits[0].newText" is required',
    ),
    (
        "edit",
        '{"path": "a", "edits": [{"oldText": "x", "newText": "y", "n": 1}]}',
        'invalid arguments for edit: unknown key "n" in "edits[0]" (allowed: oldText, newText)',
    ),
    (
        "edit",
        '{"path": "a", "edits": [{"oldText": "", "newText": "y"}]}',
        "invalid arguments for edit: edits[0].oldText is empty",
    ),
    ("edit", '{"path": "a", "oldText": "x"}', 'invalid arguments for edit: "edits[0].newText" is required'),
    ("exec", '{"command": "x", "env": {"A": 1}}', 'invalid arguments for exec: "env.A" must be a string, not a number'),
    ("exec", '{"command": "x", "env": ["A"]}', 'invalid arguments for exec: "env" must be an object, not an array'),
    (
        "exec",
        '{"command": "x", "env": {"PATH": "/tmp"}}',
        'invalid arguments for exec: env key "PATH" may not be set (it changes which programs run or what they load)',
    ),
    (
        "exec",
        '{"command": "x", "env": {"LD_PRELOAD": "/tmp/x.so"}}',
        'invalid arguments for exec: env key "LD_PRELOAD" may not be set',
    ),
    (
        "exec",
        '{"command": "x", "env": {"DYLD_INSERT_LIBRARIES": "x"}}',
        'invalid arguments for exec: env key "DYLD_INSERT_LIBRARIES" may not be set',
    ),
    (
        "exec",
        '{"command": "x", "env": {"BASH_ENV": "/tmp/x"}}',
        'invalid arguments for exec: env key "BASH_ENV" may not be set',
    ),
    (
        "exec",
        '{"command": "x", "env": {"1A": "x"}}',
        'invalid arguments for exec: env key "1A" is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)',
    ),
    (
        "exec",
        '{"command": "x", "env": {"A-B": "x"}}',
        'invalid arguments for exec: env key "A-B" is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)',
    ),
    (
        "exec",
        '{"command": "x", "env": {"A": "x\\u0000y"}}',
        'invalid arguments for exec: env value of "A" contains a NUL byte',
    ),
    (
        "exec",
        json.dumps({"command": "x", "env": {f"K{i}": "v" for i in range(65)}}),
        'invalid arguments for exec: "env" must have at most 64 entries',
    ),
]


@pytest.mark.parametrize(("name", "raw", "message"), MALFORMED, ids=[m[2][:60] for m in MALFORMED])
def test_prepare_refuses_a_malformed_call_with_one_line_for_the_model(name, raw, message, root):
    with pytest.raises(ToolCallError) as refusal:
        runner_for(root).prepare(name, raw)
    assert refusal.value.message.startswith(message)
    assert "\n" not in refusal.value.message
    assert str(refusal.value) == refusal.value.message


@pytest.mark.parametrize(
    ("name", "key", "limit"),
    [
        ("read", "path", 4096),
        ("write", "content", 8 * 1024 * 1024),
        ("exec", "command", 64 * 1024),
        ("grep", "pattern", 4 * 1024),
        ("find", "pattern", 4 * 1024),
    ],
)
def test_prepare_refuses_strings_over_their_limits(name, key, limit, root):
    runner = runner_for(root)
    base = {"read": {"path": "a"}, "write": {"path": "a", "content": ""}, "exec": {"command": "x"}}
    arguments = {**base.get(name, {"pattern": "x"}), key: "x" * limit}
    assert runner.prepare(name, arguments).arguments[key] == "x" * limit
    with pytest.raises(ToolCallError, match=f'"{key}" is too long'):
        runner.prepare(name, {**arguments, key: "x" * (limit + 1)})


def test_prepare_refuses_more_than_50_edits(root):
    edits = [{"oldText": f"x{i}", "newText": "y"} for i in range(51)]
    with pytest.raises(ToolCallError, match='"edits" must have at most 50 items'):
        runner_for(root).prepare("edit", {"path": "a", "edits": edits})


def test_prepare_accepts_a_parsed_object_empty_arguments_and_integral_numbers(root):
    runner = runner_for(root)
    assert runner.prepare("ls", "") == PreparedCall("ls", {})
    assert runner.prepare("ls", "  ") == PreparedCall("ls", {})
    assert runner.prepare("read", {"path": "a", "offset": 2.0}) == PreparedCall("read", {"path": "a", "offset": 2})
    assert type(runner.prepare("read", '{"path": "a", "offset": 2.0}').arguments["offset"]) is int


def test_prepare_turns_the_legacy_single_edit_into_edits(root):
    prepared = runner_for(root).prepare("edit", '{"path": "a", "oldText": "x", "newText": "y"}')
    assert prepared.arguments == {"path": "a", "edits": [{"oldText": "x", "newText": "y"}]}


def test_prepare_checks_against_the_limits_the_runner_was_given(root):
    runner = runner_for(root, exec_timeout_s=10, exec_max_timeout_s=60)
    with pytest.raises(ToolCallError, match='"timeoutSeconds" must be at most 60'):
        runner.prepare("exec", {"command": "x", "timeoutSeconds": 61})
    assert runner.tool_specs(("exec",))[0]["function"]["parameters"]["properties"]["timeoutSeconds"]["maximum"] == 60


# --- the schemas the model sees ------------------------------------------------------------------------------


def test_tool_specs_are_chat_completions_tools_in_the_order_asked():
    specs = tool_specs()
    assert [spec["function"]["name"] for spec in specs] == list(TOOL_NAMES)
    for spec in specs:
        assert spec["type"] == "function"
        assert set(spec["function"]) == {"name", "description", "parameters"}
        assert spec["function"]["description"]
        parameters = spec["function"]["parameters"]
        assert parameters["type"] == "object"
        assert parameters["additionalProperties"] is False
        json.dumps(spec)
    assert [spec["function"]["name"] for spec in tool_specs(["exec", "read"])] == ["exec", "read"]
    with pytest.raises(ValueError, match="unknown tool"):
        tool_specs(["rm"])


def test_the_edit_schema_shows_edits_not_the_legacy_form():
    parameters = tool_specs(["edit"])[0]["function"]["parameters"]
    assert set(parameters["properties"]) == {"path", "edits"}
    assert parameters["required"] == ["path", "edits"]


def test_a_schema_keyword_the_validator_does_not_enforce_is_refused():
    with pytest.raises(ValueError, match="pattern"):
        schema.check_schema({"type": "string", "pattern": "^a"})
    with pytest.raises(ValueError):
        schema.check_schema({"type": "object", "properties": {"a": {"type": "string", "format": "uri"}}})


def _sample(spec: dict):
    return {"string": "x", "integer": 1, "number": 1, "boolean": True, "array": [], "object": {}}[spec["type"]]


@pytest.mark.parametrize("name", TOOL_NAMES)
def test_the_validator_enforces_every_rule_the_model_is_shown(name, root):
    """Walks the schema the model sees: each required key, maximum and maxLength it states is enforced."""
    runner = runner_for(root)
    parameters = tool_specs([name])[0]["function"]["parameters"]
    valid = {
        "read": {"path": "a"},
        "write": {"path": "a", "content": "c"},
        "edit": {"path": "a", "edits": [{"oldText": "a", "newText": "b"}]},
        "ls": {},
        "find": {"pattern": "*"},
        "grep": {"pattern": "x"},
        "exec": {"command": "true"},
    }[name]
    runner.prepare(name, valid)
    for key in parameters["required"]:
        with pytest.raises(ToolCallError, match=f'"{key}" is required'):
            runner.prepare(name, {k: v for k, v in valid.items() if k != key})
    for key, rule in parameters["properties"].items():
        if "maxLength" in rule:
            with pytest.raises(ToolCallError, match=f'"{key}" is too long'):
                runner.prepare(name, {**valid, key: "x" * (rule["maxLength"] + 1)})
        if "maximum" in rule:
            with pytest.raises(ToolCallError, match=f'"{key}" must be at most'):
                runner.prepare(name, {**valid, key: rule["maximum"] + 1})
        if "minimum" in rule:
            with pytest.raises(ToolCallError, match=f'"{key}" must be at least'):
                runner.prepare(name, {**valid, key: rule["minimum"] - 1})
        wrong = "x" if rule["type"] != "string" else 1
        with pytest.raises(ToolCallError, match=f'"{key}" must be'):
            runner.prepare(name, {**valid, key: wrong})
    with pytest.raises(ToolCallError, match='unknown key "extra"'):
        runner.prepare(name, {**valid, "extra": _sample({"type": "string"})})


# --- read --------------------------------------------------------------------------------------------------


def test_read_returns_the_text_and_honours_offset_and_limit(root):
    (root / "f.txt").write_text("one\ntwo\nthree\nfour\n")
    runner = runner_for(root)

    assert ok(runner, "read", {"path": "f.txt"}).text == "one\ntwo\nthree\nfour\n"
    assert ok(runner, "read", {"path": "f.txt", "offset": 3}).text == "three\nfour\n"
    result = ok(runner, "read", {"path": "f.txt", "offset": 2, "limit": 2})
    assert result.text == "two\nthree\n\n[More lines in file. Use offset=4 to continue.]"
    assert result.details["nextOffset"] == 4
    assert ok(runner, "read", {"path": "f.txt", "offset": 4, "limit": 1}).text == "four\n"


def test_read_stops_at_the_line_cap_and_says_where_to_continue(root):
    (root / "f.txt").write_text("".join(f"line {n}\n" for n in range(1, 13)))
    runner = runner_for(root, read_max_lines=5)

    first = ok(runner, "read", {"path": "f.txt", "limit": 100})
    assert first.text.endswith("line 5\n\n[Showing lines 1-5 (read limit 5 lines). Use offset=6 to continue.]")
    pages = [first.text.split("\n[")[0]]
    offset = first.details["nextOffset"]
    while offset:
        page = ok(runner, "read", {"path": "f.txt", "offset": offset})
        pages.append(page.text.split("\n[")[0])
        offset = page.details["nextOffset"]
    assert "".join(pages) == (root / "f.txt").read_text()


def test_read_stops_at_the_byte_cap_before_the_line_cap(root):
    (root / "f.txt").write_text("x" * 40 + "\n" + "y" * 40 + "\n" + "z" * 40 + "\n")
    result = ok(runner_for(root, read_max_bytes=100), "read", {"path": "f.txt"})
    assert (
        result.text
        == "x" * 40 + "\n" + "y" * 40 + "\n\n[Showing lines 1-2 (read limit 100 bytes). Use offset=3 to continue.]"
    )
    assert result.details == {"path": "f.txt", "offset": 1, "lines": 2, "nextOffset": 3}


def test_read_shows_the_start_of_a_line_longer_than_the_byte_cap(root):
    (root / "f.txt").write_text("short\n" + "L" * 5000 + "\nafter\n")
    runner = runner_for(root, read_max_bytes=2048)
    result = ok(runner, "read", {"path": "f.txt", "offset": 2})
    assert result.text.startswith("L" * 2048 + "\n\n[Line 2 is 5001 bytes, over the 2 KiB read limit")
    assert "offset=3" in result.text
    assert ok(runner, "read", {"path": "f.txt", "offset": 3}).text == "after\n"


def test_read_refuses_a_binary_file_and_replaces_invalid_utf8(root):
    (root / "bin").write_bytes(b"\x7fELF\x00\x01\x02" + b"x" * 100)
    (root / "late-nul").write_bytes(b"a" * 9000 + b"\x00")
    (root / "latin1").write_bytes(b"caf\xe9\n")
    runner = runner_for(root)

    assert refused(runner, "read", {"path": "bin"}) == "bin is a binary file; read shows text files only"
    assert ok(runner, "read", {"path": "latin1"}).text == "caf\ufffd\n"
    assert ok(runner, "read", {"path": "late-nul", "limit": 1}).text.startswith("aaa")  # only the first 8 KiB decide


def test_read_errors(root):
    (root / "f.txt").write_text("a\nb\n")
    (root / "empty").write_text("")
    (root / "dir").mkdir()
    runner = runner_for(root)

    assert refused(runner, "read", {"path": "f.txt", "offset": 3}) == "offset 3 is beyond the end of f.txt (2 lines)"
    assert ok(runner, "read", {"path": "empty"}).text == "(empty file)"
    assert refused(runner, "read", {"path": "missing.txt"}) == '"missing.txt": no such file or directory'
    assert refused(runner, "read", {"path": "dir"}) == "dir is a directory, not a file"
    assert refused(runner, "read", {"path": "."}) == ". is a directory, not a file"
    assert refused(runner, "read", {"path": "f.txt/x"}) == "f.txt is not a directory"
    assert refused(runner, "read", {"path": "f.txt/x/y"}) == "f.txt/x: a component of the path is not a directory"


# --- write -------------------------------------------------------------------------------------------------


def test_write_creates_parents_and_reports_bytes(root):
    result = ok(runner_for(root), "write", {"path": "a/b/c.txt", "content": "héllo"})
    assert result.text == "Wrote 6 bytes to a/b/c.txt"
    assert result.details == {"path": "a/b/c.txt", "bytes": 6}
    assert (root / "a" / "b" / "c.txt").read_text() == "héllo"


def test_write_replaces_atomically_and_keeps_the_mode_of_an_existing_file(root):
    script = root / "run.sh"
    script.write_text("old")
    script.chmod(0o750)
    inode = script.stat().st_ino

    ok(runner_for(root), "write", {"path": "run.sh", "content": "new"})

    assert script.read_text() == "new"
    assert stat.S_IMODE(script.stat().st_mode) == 0o750
    assert script.stat().st_ino != inode  # a new file renamed over the old one
    assert sorted(p.name for p in root.iterdir()) == ["run.sh"]  # no temporary file left


def test_write_refuses_a_directory(root):
    (root / "d").mkdir()
    assert refused(runner_for(root), "write", {"path": "d", "content": "x"}) == "d is a directory, not a file"


class SetAfter(threading.Event):
    """An event that reads as set from its ``n``-th check on: cancels a call at a chosen point."""

    def __init__(self, n: int):
        super().__init__()
        self.checks = 0
        self.n = n

    def is_set(self) -> bool:
        self.checks += 1
        return self.checks >= self.n or super().is_set()


def test_a_cancelled_write_writes_nothing(root):
    (root / "f.txt").write_text("before")
    runner = runner_for(root)
    cancel = threading.Event()
    cancel.set()

    result = call(runner, "write", {"path": "f.txt", "content": "after"}, cancel)
    assert result.is_error and result.details["aborted"] is True
    assert (root / "f.txt").read_text() == "before"

    # Cancelled after the temporary file was written, before the rename.
    result = call(runner, "write", {"path": "f.txt", "content": "after"}, SetAfter(3))
    assert result.is_error and result.details["aborted"] is True
    assert (root / "f.txt").read_text() == "before"
    assert sorted(p.name for p in root.iterdir()) == ["f.txt"]


# --- edit --------------------------------------------------------------------------------------------------


def test_edit_applies_every_edit_against_the_original(root):
    (root / "f.py").write_text("a = 1\nb = 2\nc = 3\n")
    result = ok(
        runner_for(root),
        "edit",
        {
            "path": "f.py",
            "edits": [{"oldText": "c = 3", "newText": "c = 30"}, {"oldText": "a = 1", "newText": "b = 2"}],
        },
    )
    assert (root / "f.py").read_text() == "b = 2\nb = 2\nc = 30\n"
    assert result.text == "Successfully replaced 2 block(s) in f.py."
    assert result.details == {"path": "f.py", "replacements": 2, "firstChangedLine": 1}


def test_edit_accepts_the_legacy_form(root):
    (root / "f.txt").write_text("hello world")
    ok(runner_for(root), "edit", {"path": "f.txt", "oldText": "world", "newText": "there"})
    assert (root / "f.txt").read_text() == "hello there"


def test_edit_refuses_an_ambiguous_old_text(root):
    (root / "f.txt").write_text("x = 1\nx = 1\n")
    text = refused(runner_for(root), "edit", {"path": "f.txt", "edits": [{"oldText": "x = 1", "newText": "y"}]})
    assert text == (
        "Found 2 occurrences of edits[0] in f.txt. Each oldText must be unique. "
        "Please provide more context to make it unique."
    )
    # Overlapping occurrences count too.
    (root / "g.txt").write_text("aaa")
    text = refused(runner_for(root), "edit", {"path": "g.txt", "edits": [{"oldText": "aa", "newText": "b"}]})
    assert text.startswith("Found 2 occurrences of edits[0] in g.txt.")


def test_edit_is_all_or_nothing(root):
    original = "one\ntwo\nthree\n"
    (root / "f.txt").write_text(original)
    runner = runner_for(root)

    text = refused(
        runner,
        "edit",
        {"path": "f.txt", "edits": [{"oldText": "one", "newText": "1"}, {"oldText": "four", "newText": "4"}]},
    )
    assert text.startswith("Could not find edits[1].oldText in f.txt.")
    text = refused(
        runner,
        "edit",
        {
            "path": "f.txt",
            "edits": [{"oldText": "one\ntwo", "newText": "x"}, {"oldText": "two\nthree", "newText": "y"}],
        },
    )
    assert text == "edits[0] and edits[1] overlap in f.txt; merge them into one edit"
    text = refused(runner, "edit", {"path": "f.txt", "edits": [{"oldText": "two", "newText": "two"}]})
    assert text == "No changes made to f.txt: the replacements produce identical content"
    assert (root / "f.txt").read_text() == original


def test_adjacent_edits_do_not_overlap(root):
    (root / "f.txt").write_text("abcd")
    ok(
        runner_for(root),
        "edit",
        {"path": "f.txt", "edits": [{"oldText": "ab", "newText": "1"}, {"oldText": "cd", "newText": "2"}]},
    )
    assert (root / "f.txt").read_text() == "12"


def test_edit_refuses_binary_and_non_utf8_files(root):
    (root / "bin").write_bytes(b"a\x00b")
    (root / "latin1").write_bytes(b"caf\xe9")
    runner = runner_for(root)
    edits = [{"oldText": "a", "newText": "b"}]
    assert (
        refused(runner, "edit", {"path": "bin", "edits": edits}) == "bin is a binary file; edit changes text files only"
    )
    assert (
        refused(runner, "edit", {"path": "latin1", "edits": edits})
        == "latin1 is not valid UTF-8 text; edit would corrupt it"
    )
    assert (root / "latin1").read_bytes() == b"caf\xe9"


def test_a_cancelled_edit_writes_nothing(root):
    (root / "f.txt").write_text("before")
    result = call(
        runner_for(root), "edit", {"path": "f.txt", "edits": [{"oldText": "before", "newText": "after"}]}, SetAfter(2)
    )
    assert result.is_error and result.details["aborted"] is True
    assert (root / "f.txt").read_text() == "before"


# --- ls ----------------------------------------------------------------------------------------------------


def test_ls_lists_sorted_by_bytes_with_directories_marked_and_dotfiles(root):
    for name in ("b.txt", "B.txt", ".env", "_x", "a"):
        (root / name).write_text("")
    (root / "dir").mkdir()
    (root / "link").symlink_to("dir")
    result = ok(runner_for(root), "ls", {})
    assert result.text == ".env\nB.txt\n_x\na\nb.txt\ndir/\nlink"
    assert result.details == {"path": ".", "entries": 7, "nextAfter": None, "complete": True}


def test_ls_pages_with_the_after_cursor(root):
    names = [f"f{n:02}" for n in range(7)]
    for name in names:
        (root / name).write_text("")
    runner = runner_for(root)

    seen = []
    after = None
    while True:
        arguments = {"limit": 3} | ({"after": after} if after else {})
        result = ok(runner, "ls", arguments)
        page = result.text.split("\n\n[")[0].split("\n")
        seen += page
        after = result.details["nextAfter"]
        if after is None:
            break
        assert result.text.endswith(f'more entries. Use after="{after}" to continue.]')
    assert seen == names
    assert ok(runner, "ls", {"after": "f06"}).text == "(no more entries)"


def test_ls_of_a_subdirectory_an_empty_one_and_a_file(root):
    (root / "sub" / "empty").mkdir(parents=True)
    (root / "sub" / "f").write_text("")
    runner = runner_for(root)
    assert ok(runner, "ls", {"path": "sub"}).text == "empty/\nf"
    assert ok(runner, "ls", {"path": "sub/empty"}).text == "(empty directory)"
    assert refused(runner, "ls", {"path": "sub/f"}) == "sub/f is not a directory"
    assert refused(runner, "find", {"pattern": "*", "path": "sub/f"}) == "sub/f is not a directory"
    assert refused(runner, "ls", {"path": "nope"}) == '"nope": no such file or directory'


def test_ls_reads_a_bounded_number_of_entries(root):
    for n in range(30):
        (root / f"f{n:02}").write_text("")
    result = ok(runner_for(root, walk_max_entries=10), "ls", {})
    assert len(result.text.split("\n\n[")[0].split("\n")) == 10
    assert "has more than 10 entries" in result.text
    assert result.details["complete"] is False


# --- find --------------------------------------------------------------------------------------------------


@pytest.fixture
def tree(root: Path) -> Path:
    for path in (
        "main.py",
        "src/app.py",
        "src/lib/util.py",
        "src/lib/util.ts",
        "src/lib/view.tsx",
        "docs/readme.md",
        ".hidden.py",
        ".git/hooks/pre-commit.py",
        "sub/.git/x.py",
    ):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("print('needle')\n")
    return root


def test_find_by_name_at_any_depth_or_by_relative_path(tree):
    runner = runner_for(tree)
    assert ok(runner, "find", {"pattern": "*.py"}).text == ".hidden.py\nmain.py\nsrc/app.py\nsrc/lib/util.py"
    assert ok(runner, "find", {"pattern": "**/*.py"}).text == ".hidden.py\nmain.py\nsrc/app.py\nsrc/lib/util.py"
    assert ok(runner, "find", {"pattern": "src/**/*.py"}).text == "src/app.py\nsrc/lib/util.py"
    assert ok(runner, "find", {"pattern": "*.py", "path": "src/lib"}).text == "util.py"
    assert ok(runner, "find", {"pattern": "*.{ts,tsx}"}).text == "src/lib/util.ts\nsrc/lib/view.tsx"
    assert ok(runner, "find", {"pattern": "lib"}).text == "src/lib/"
    assert ok(runner, "find", {"pattern": "util.[!p]*"}).text == "src/lib/util.ts"


def test_find_skips_git_and_caps_its_results(tree):
    runner = runner_for(tree)
    everything = ok(runner, "find", {"pattern": "**"}).text.split("\n")
    assert not any(".git" in path for path in everything)
    result = ok(runner, "find", {"pattern": "**", "limit": 3})
    assert result.text.split("\n\n")[0].split("\n") == everything[:3]
    assert result.text.endswith(
        f"[{len(everything) - 3} more results not shown. Use limit=6 for more, or refine the pattern.]"
    )
    assert result.details["truncated"] is True
    assert ok(runner, "find", {"pattern": "*.rs"}).text == 'No files found matching "*.rs"'


def test_find_looks_at_a_bounded_number_of_entries(tree):
    result = ok(runner_for(tree, walk_max_entries=4), "find", {"pattern": "**"})
    assert "[Stopped after looking at 4 directory entries; search a narrower path.]" in result.text


def test_find_does_not_follow_symlinked_directories_even_inside(tree):
    (tree / "loop").symlink_to(".")
    result = ok(runner_for(tree), "find", {"pattern": "*.py"})
    assert result.text == ".hidden.py\nmain.py\nsrc/app.py\nsrc/lib/util.py"


def test_find_refuses_a_bad_glob(tree):
    assert refused(runner_for(tree), "find", {"pattern": "[z-a]"}).startswith('invalid glob "[z-a]"')


# --- grep --------------------------------------------------------------------------------------------------


def test_grep_reports_path_line_and_text(tree):
    (tree / "src" / "app.py").write_text("import os\nNEEDLE = 1\nprint(needle)\n")
    result = ok(runner_for(tree), "grep", {"pattern": "needle", "path": "src"})
    assert result.text.split("\n") == [
        "app.py:3: print(needle)",
        "lib/util.py:1: print('needle')",
        "lib/util.ts:1: print('needle')",
        "lib/view.tsx:1: print('needle')",
    ]
    ignore_case = ok(runner_for(tree), "grep", {"pattern": "needle", "path": "src/app.py", "ignoreCase": True})
    assert ignore_case.text == "src/app.py:2: NEEDLE = 1\nsrc/app.py:3: print(needle)"


def test_grep_literal_glob_and_context(tree):
    (tree / "notes.md").write_text("a\nb\nprice: $5 (x)\nc\nd\ne\nf\n$5 (x) again\n")
    runner = runner_for(tree)
    assert ok(runner, "grep", {"pattern": "$5 (x)", "literal": True, "glob": "*.md"}).text == (
        "notes.md:3: price: $5 (x)\nnotes.md:8: $5 (x) again"
    )
    assert ok(runner, "grep", {"pattern": "$5 (x)", "literal": True, "context": 1}).text == (
        "notes.md-2- b\nnotes.md:3: price: $5 (x)\nnotes.md-4- c\n--\nnotes.md-7- f\nnotes.md:8: $5 (x) again"
    )
    assert ok(runner, "grep", {"pattern": "needle", "glob": "src/**/*.ts"}).text == "src/lib/util.ts:1: print('needle')"


def test_grep_skips_git_binary_and_oversized_files(tree):
    (tree / "blob.bin").write_bytes(b"needle\x00needle")
    (tree / "big.txt").write_text("needle\n" * 200)
    result = ok(runner_for(tree, grep_max_file_bytes=1000), "grep", {"pattern": "needle", "limit": 1000})
    paths = {line.split(":")[0] for line in result.text.split("\n\n")[0].split("\n")}
    assert paths == {
        ".hidden.py",
        "main.py",
        "src/app.py",
        "src/lib/util.py",
        "src/lib/util.ts",
        "src/lib/view.tsx",
        "docs/readme.md",
    }
    assert "[1 file(s) over 1000 bytes skipped.]" in result.text


def test_grep_caps_matches_lines_and_bytes_scanned(tree):
    (tree / "many.txt").write_text("needle " + "x" * 600 + "\n" + "needle\n" * 20)
    runner = runner_for(tree, grep_line_max_chars=50)
    result = ok(runner, "grep", {"pattern": "needle", "path": "many.txt", "limit": 5})
    lines = result.text.split("\n\n")[0].split("\n")
    assert len(lines) == 5
    assert lines[0] == "many.txt:1: needle " + "x" * 43 + "… [557 more characters]"
    assert result.text.endswith("[5 matches limit reached. Use limit=10 for more, or refine the pattern.]")

    bounded = ok(runner_for(tree, grep_max_scan_bytes=40), "grep", {"pattern": "needle"})
    assert bounded.details["bytesScanned"] <= 40
    assert "[Stopped after reading 40 bytes; search a narrower path or glob.]" in bounded.text


def test_grep_refuses_a_bad_regex_and_says_when_nothing_matched(tree):
    runner = runner_for(tree)
    assert refused(runner, "grep", {"pattern": "(unclosed"}).startswith(
        'invalid regular expression "(unclosed": missing )'
    )
    assert ok(runner, "grep", {"pattern": "nothing-like-this"}).text == "No matches found"


def test_grep_and_find_stop_when_cancelled(tree):
    runner = runner_for(tree)
    for name, arguments in (("grep", {"pattern": "needle"}), ("find", {"pattern": "*"})):
        result = call(runner, name, arguments, SetAfter(3))
        assert result.is_error and result.details["aborted"] is True


# --- results -----------------------------------------------------------------------------------------------


def test_a_long_result_keeps_its_head_and_tail_and_the_whole_text_as_full_text(root):
    for n in range(400):
        (root / f"file-{n:04}.txt").write_text("")
    result = ok(runner_for(root, result_max_bytes=1024, artifact_max_bytes=4096), "ls", {"limit": 400})
    assert len(result.text.encode()) < 1100
    assert result.text.startswith("file-0000.txt\n")
    assert result.text.endswith("file-0399.txt")
    assert "bytes omitted]…" in result.text
    assert result.details["truncated"] is True
    assert result.full_text is not None
    assert result.full_text.startswith("file-0000.txt\nfile-0001.txt\n")
    assert len(result.full_text.encode()) < 4096 + 100
    assert "more bytes not kept" in result.full_text


def test_run_is_safe_from_many_threads(root):
    runner = runner_for(root)
    results: list[ToolResult] = []

    def work(n: int) -> None:
        results.append(call(runner, "write", {"path": f"d{n % 3}/f{n}.txt", "content": str(n)}))
        results.append(call(runner, "read", {"path": f"d{n % 3}/f{n}.txt"}))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(24)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not [result.text for result in results if result.is_error]
    assert sorted(p.name for p in root.iterdir()) == ["d0", "d1", "d2"]


def test_the_tools_import_only_the_standard_library():
    """The worker child runs them from the worker bundle, where nothing else is installed."""
    package = Path(schema.__file__).parent
    for module in package.glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top == "__future__", f"{module.name} imports {name}"


def test_ls_lists_special_files_that_read_refuses(root):
    os.mkfifo(root / "pipe")
    runner = runner_for(root)
    assert ok(runner, "ls", {}).text == "pipe"
    assert refused(runner, "read", {"path": "pipe"}) == "pipe is a FIFO; only regular files can be read or written"


def test_a_walk_does_not_enter_directories_nested_too_deeply(root):
    deep = root.joinpath(*["d"] * 70)
    deep.mkdir(parents=True)
    (deep / "bottom.txt").write_text("needle")
    runner = runner_for(root)
    result = ok(runner, "find", {"pattern": "*.txt"})
    assert (
        result.text
        == 'No files found matching "*.txt"\n\n[Some directories are nested too deeply and were not searched.]'
    )
    assert (
        ok(runner, "grep", {"pattern": "needle", "path": "/".join(["d"] * 60)}).text
        == "d/d/d/d/d/d/d/d/d/d/bottom.txt:1: needle"
    )


def test_limits_must_be_coherent():
    with pytest.raises(ValueError, match="exec_timeout_s must not exceed"):
        ToolLimits(exec_timeout_s=100, exec_max_timeout_s=50)
    with pytest.raises(ValueError, match="read_max_lines must be positive"):
        ToolLimits(read_max_lines=0)
    with pytest.raises(ValueError, match="artifact_max_bytes must be at least result_max_bytes"):
        ToolLimits(result_max_bytes=1024, artifact_max_bytes=512)
