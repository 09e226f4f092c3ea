// tools.mjs on its own (node --test): every tool's happy path and its refusals. The parity with the Python tool
// layer is tests/workers_app/test_openclaw_worker_tools.py.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { afterEach, beforeEach, describe, test } from "node:test";

import {
  ExecSlots,
  TOOL_NAMES,
  ToolCallError,
  ToolRunner,
  commandEnv,
  errorResult,
  refusedExecResult,
  toolLimits,
  toolSpecs,
} from "../tools.mjs";

let base;
let root;
let outside;
let slotsDir;

beforeEach(() => {
  base = fs.mkdtempSync(path.join(os.tmpdir(), "octools-"));
  root = path.join(base, "ws");
  outside = path.join(base, "outside");
  slotsDir = path.join(base, "slots");
  fs.mkdirSync(root);
  fs.mkdirSync(outside);
  fs.writeFileSync(path.join(outside, "secret.txt"), "secret\n");
  fs.writeFileSync(path.join(root, "a.txt"), "alpha\nbeta\ngamma\n");
});

afterEach(() => {
  fs.rmSync(base, { recursive: true, force: true });
});

function runnerFor(limits = {}) {
  return new ToolRunner(root, { execSlots: { dir: slotsDir, count: 4 }, ...limits });
}

/** What the agent loop records for a call: prepare's refusal, or the run's result. */
async function call(runner, name, args, options = {}) {
  const prepared = runner.prepare(name, typeof args === "string" ? args : JSON.stringify(args));
  if (!prepared.ok) return prepared.result;
  return runner.run(prepared.call, options);
}

const text = (result) => result.content[0].text;

async function ok(runner, name, args) {
  const result = await call(runner, name, args);
  assert.equal(result.isError, false, text(result));
  return result;
}

async function refused(runner, name, args) {
  const result = await call(runner, name, args);
  assert.equal(result.isError, true, text(result));
  assert.deepEqual(result.content.length, 1);
  return text(result);
}

function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return error.code === "EPERM";
  }
}

async function gone(pid) {
  // Reaped by init once killed; a zombie still answers kill(0), so look at its state as well.
  for (let attempt = 0; attempt < 100; attempt++) {
    if (!alive(pid)) return true;
    try {
      if (fs.readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1].startsWith("Z")) return true;
    } catch {
      return true;
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  return false;
}

function pathArguments(tool, where) {
  switch (tool) {
    case "read":
    case "ls":
      return { path: where };
    case "write":
      return { path: where, content: "x" };
    case "edit":
      return { path: where, edits: [{ oldText: "secret", newText: "x" }] };
    case "find":
      return { pattern: "*", path: where };
    case "grep":
      return { pattern: "secret", path: where };
    default:
      return { command: "cat secret.txt", workdir: where };
  }
}

describe("specs and preparing", () => {
  test("the tool names and specs are the seven tools with their schemas", () => {
    assert.deepEqual([...TOOL_NAMES], ["read", "write", "edit", "ls", "find", "grep", "exec"]);
    const specs = toolSpecs();
    assert.deepEqual(
      specs.map((spec) => spec.function.name),
      [...TOOL_NAMES],
    );
    const exec = specs.at(-1).function.parameters;
    assert.equal(exec.properties.timeoutSeconds.maximum, 1800);
    assert.equal(exec.additionalProperties, false);
    assert.match(specs.at(-1).function.description, /default 120\)\.$/);
  });

  test("a runner's specs show its own limits", () => {
    const runner = runnerFor({ execTimeoutMs: 3_600_000, lsLimit: 7 });
    const specs = runner.toolSpecs();
    const exec = specs.find((spec) => spec.function.name === "exec").function;
    assert.match(exec.description, /default 3600\)/);
    assert.equal(exec.parameters.properties.timeoutSeconds.maximum, 3600);
    assert.match(specs.find((spec) => spec.function.name === "ls").function.description, /7 per page/);
  });

  test("limits are checked", () => {
    assert.throws(() => toolLimits({ readMaxBytes: 0 }), RangeError);
    assert.throws(() => toolLimits({ execTimeoutMs: 10_000, execMaxTimeoutMs: 5000 }), RangeError);
    assert.throws(() => toolLimits({ artifactMaxBytes: 10, resultMaxBytes: 100 }), RangeError);
    assert.throws(() => toolLimits({ noSuchLimit: 1 }), TypeError);
    // A launch without an exec timeout leaves the default.
    assert.equal(toolLimits({ execTimeoutMs: undefined }).execTimeoutMs, 120_000);
    assert.equal(toolLimits({ execTimeoutMs: 3_600_000 }).execMaxTimeoutMs, 3_600_000);
    assert.deepEqual(toolSpecs(["exec"], { execTimeoutMs: 30_000 })[0].function.description.match(/default 30\)/)?.[0], "default 30)");
  });

  const malformed = [
    ["nope", "{}", 'unknown tool "nope"; available: read, write, edit, ls, find, grep, exec'],
    ["read", "{bad", "invalid arguments for read: not valid JSON ("],
    ["read", "[]", "invalid arguments for read: expected a JSON object, not an array"],
    ["read", "[".repeat(20000) + "]".repeat(20000), "invalid arguments for read: nested too deeply"],
    ["read", "{}", 'invalid arguments for read: "path" is required'],
    ["read", '{"path": 3}', 'invalid arguments for read: "path" must be a string, not a number'],
    ["read", '{"path": "a", "offset": 1.5}', 'invalid arguments for read: "offset" must be an integer, not a number'],
    ["read", '{"path": "a", "offset": 0}', 'invalid arguments for read: "offset" must be at least 1'],
    ["read", '{"path": "\\ud800"}', 'invalid arguments for read: "path" is not valid Unicode text'],
    ["read", '{"path": "a", "file": 1}', 'invalid arguments for read: unknown key "file" in arguments'],
    ["read", '{"path": "a", "__proto__": 1}', 'invalid arguments for read: unknown key "__proto__" in arguments'],
    ["read", '{"path": "a", "constructor": 1}', 'invalid arguments for read: unknown key "constructor" in arguments'],
    ["ls", '{"limit": 10001}', 'invalid arguments for ls: "limit" must be at most 10000'],
    ["edit", '{"path": "a", "edits": []}', 'invalid arguments for edit: "edits" must have at least 1 item(s)'],
    ["edit", '{"path": "a", "oldText": "x"}', 'invalid arguments for edit: "edits[0].newText" is required'],
    ["edit", '{"path": "a", "edits": [{"oldText": "", "newText": "y"}]}', "invalid arguments for edit: edits[0].oldText is empty"],
    ["exec", '{"command": "x", "timeoutSeconds": 0.5}', 'invalid arguments for exec: "timeoutSeconds" must be at least 1'],
    ["exec", '{"command": "x", "env": {"PATH": "/tmp"}}', 'invalid arguments for exec: env key "PATH" may not be set'],
    ["exec", '{"command": "x", "env": {"LD_PRELOAD": "x"}}', 'invalid arguments for exec: env key "LD_PRELOAD" may not be set'],
    ["exec", '{"command": "x", "env": {"A-B": "x"}}', 'invalid arguments for exec: env key "A-B" is not a valid variable name'],
    ["exec", '{"command": "x", "env": {"A": "x\\u0000"}}', 'invalid arguments for exec: env value of "A" contains a NUL byte'],
    ["exec", '{"command": "x", "env": {"A": 1}}', 'invalid arguments for exec: "env.A" must be a string, not a number'],
  ];
  for (const [name, raw, message] of malformed) {
    test(`a malformed call is answered, not thrown: ${message.slice(0, 70)}`, () => {
      const prepared = runnerFor().prepare(name, raw);
      assert.equal(prepared.ok, false);
      assert.equal(prepared.result.isError, true);
      assert.deepEqual(prepared.result.details, {});
      assert.ok(text(prepared.result).startsWith(message), text(prepared.result));
      assert.ok(!text(prepared.result).includes("\n"));
    });
  }

  test("the legacy single-edit form and integral numbers are accepted", () => {
    const runner = runnerFor();
    const edit = runner.prepare("edit", '{"path": "a.txt", "oldText": "beta", "newText": "BETA"}');
    assert.deepEqual(edit.call.arguments, { path: "a.txt", edits: [{ oldText: "beta", newText: "BETA" }] });
    assert.deepEqual(runner.prepare("read", '{"path": "a.txt", "offset": 2.0}').call.arguments, { path: "a.txt", offset: 2 });
    assert.deepEqual(runner.prepare("ls", "").call.arguments, {});
    assert.deepEqual(runner.prepare("read", { path: "a.txt" }).call.arguments, { path: "a.txt" });
  });

  test("an env key named __proto__ is an own entry, not a prototype", () => {
    const prepared = runnerFor().prepare("exec", '{"command": "x", "env": {"__proto__": "v"}}');
    assert.equal(prepared.ok, true);
    const env = commandEnv(prepared.call.arguments.env, { PATH: "/bin" });
    assert.equal(Object.getOwnPropertyDescriptor(env, "__proto__").value, "v");
  });
});

describe("file tools", () => {
  test("read, write, edit, ls, find and grep do their work", async () => {
    const runner = runnerFor();
    assert.equal(text(await ok(runner, "read", { path: "a.txt" })), "alpha\nbeta\ngamma\n");
    assert.equal(text(await ok(runner, "read", { path: "a.txt", offset: 2, limit: 1 })), "beta\n\n[More lines in file. Use offset=3 to continue.]");
    const written = await ok(runner, "write", { path: "dir/sub/b.txt", content: "héllo\n" });
    assert.equal(text(written), "Wrote 7 bytes to dir/sub/b.txt");
    assert.deepEqual(written.details, { path: "dir/sub/b.txt", bytes: 7 });
    assert.equal(fs.readFileSync(path.join(root, "dir/sub/b.txt"), "utf8"), "héllo\n");
    const edited = await ok(runner, "edit", { path: "a.txt", edits: [{ oldText: "beta", newText: "BETA" }, { oldText: "gamma", newText: "G" }] });
    assert.deepEqual(edited.details, { path: "a.txt", replacements: 2, firstChangedLine: 2 });
    assert.equal(fs.readFileSync(path.join(root, "a.txt"), "utf8"), "alpha\nBETA\nG\n");
    assert.equal(text(await ok(runner, "ls", {})), "a.txt\ndir/");
    assert.equal(text(await ok(runner, "find", { pattern: "*.txt" })), "a.txt\ndir/sub/b.txt");
    assert.equal(text(await ok(runner, "grep", { pattern: "h.llo" })), "dir/sub/b.txt:1: héllo");
    assert.deepEqual(fs.readdirSync(path.join(root, "dir/sub")), ["b.txt"]);
  });

  const escapes = {
    dotdot: () => "../outside/secret.txt",
    "dotdot-inside-first": () => {
      fs.mkdirSync(path.join(root, "sub"));
      return "sub/../../outside/secret.txt";
    },
    "absolute-outside": () => path.join(outside, "secret.txt"),
    "symlinked-file": () => {
      fs.symlinkSync(path.join(outside, "secret.txt"), path.join(root, "link.txt"));
      return "link.txt";
    },
    "symlinked-dir": () => {
      fs.symlinkSync(outside, path.join(root, "linkdir"));
      return "linkdir/secret.txt";
    },
    "relative-symlink-chain": () => {
      fs.mkdirSync(path.join(root, "a"));
      fs.symlinkSync("../..", path.join(root, "a", "up"));
      return "a/up/outside/secret.txt";
    },
    "dev-null-symlink": () => {
      fs.symlinkSync("/dev/null", path.join(root, "null"));
      return "null";
    },
  };
  for (const tool of TOOL_NAMES) {
    for (const [name, make] of Object.entries(escapes)) {
      test(`${tool}: a path leading out of the workspace (${name}) is refused`, async () => {
        const where = make();
        const message = await refused(runnerFor(), tool, pathArguments(tool, where));
        assert.match(message, /(is outside the workspace|leads outside the workspace through a symbolic link)$/);
        assert.ok(!message.includes(outside) || where.startsWith(outside), message);
        assert.deepEqual(fs.readdirSync(outside), ["secret.txt"]);
        assert.equal(fs.readFileSync(path.join(outside, "secret.txt"), "utf8"), "secret\n");
      });
    }
    test(`${tool}: a path with a NUL byte is refused`, async () => {
      const message = await refused(runnerFor(), tool, pathArguments(tool, "a.txt\u0000x"));
      assert.match(message, /contains a NUL byte$/);
    });
  }

  for (const tool of ["read", "write", "edit", "grep"]) {
    test(`${tool}: a FIFO is never opened as a file`, async () => {
      execFileSync("mkfifo", [path.join(root, "fifo")]);
      const message = await refused(runnerFor(), tool, pathArguments(tool, "fifo"));
      assert.equal(message, "fifo is a FIFO; only regular files can be read or written");
    });
  }

  test("a device reached through a path inside is refused", async () => {
    const message = await refused(runnerFor(), "read", { path: path.join(root, "..", "..", "..", "dev", "null") });
    assert.match(message, /is outside the workspace$/);
  });

  test("a directory swapped for a symlink after the check is not followed", async () => {
    const runner = runnerFor();
    fs.mkdirSync(path.join(root, "dir"));
    fs.writeFileSync(path.join(root, "dir", "f.txt"), "inside\n");
    const real = runner.workspace.resolve("dir/f.txt");
    fs.renameSync(path.join(root, "dir"), path.join(root, "gone"));
    fs.symlinkSync(outside, path.join(root, "dir"));
    fs.writeFileSync(path.join(outside, "f.txt"), "outside\n");
    assert.throws(() => runner.workspace.openRegularFile(real), (error) => {
      assert.ok(error instanceof ToolCallError);
      assert.equal(error.message, "dir changed while in use (a symbolic link appeared); try again");
      return true;
    });
    assert.throws(() => runner.workspace.writeAtomically(real, Buffer.from("x")), ToolCallError);
    assert.equal(fs.readFileSync(path.join(outside, "f.txt"), "utf8"), "outside\n");
  });

  test("a file swapped for a symlink after the check is not followed", async () => {
    const runner = runnerFor();
    const real = runner.workspace.resolve("a.txt");
    fs.rmSync(path.join(root, "a.txt"));
    fs.symlinkSync(path.join(outside, "secret.txt"), path.join(root, "a.txt"));
    assert.throws(() => runner.workspace.openRegularFile(real), /changed while in use/);
    assert.throws(() => runner.workspace.writeAtomically(real, Buffer.from("x")), /changed while in use/);
    assert.equal(fs.readFileSync(path.join(outside, "secret.txt"), "utf8"), "secret\n");
  });

  test("symlinks that stay inside the workspace are followed", async () => {
    fs.symlinkSync("a.txt", path.join(root, "inside.txt"));
    assert.equal(text(await ok(runnerFor(), "read", { path: "inside.txt" })), "alpha\nbeta\ngamma\n");
  });

  test("missing files, directories and binary files are refused with the tool's words", async () => {
    const runner = runnerFor();
    assert.equal(await refused(runner, "read", { path: "missing.txt" }), '"missing.txt": no such file or directory');
    assert.equal(await refused(runner, "read", { path: "." }), ". is a directory, not a file");
    fs.writeFileSync(path.join(root, "bin"), Buffer.from([0, 1, 2]));
    assert.equal(await refused(runner, "read", { path: "bin" }), "bin is a binary file; read shows text files only");
    assert.equal(await refused(runner, "ls", { path: "a.txt" }), "a.txt is not a directory");
    assert.match(await refused(runner, "edit", { path: "a.txt", edits: [{ oldText: "a", newText: "b" }] }), /^Found 5 occurrences of edits\[0\] in a.txt\./);
  });

  test("an abort stops a search whose regular expression backtracks without end", async () => {
    fs.writeFileSync(path.join(root, "trap.txt"), `${"a".repeat(60)}b\n`);
    const runner = runnerFor();
    const controller = new AbortController();
    const searching = runner.run(runner.prepare("grep", '{"pattern": "(a+)+$", "path": "trap.txt"}').call, {
      signal: controller.signal,
    });
    // The search holds its own thread, not this one: a timer still fires.
    await new Promise((resolve) => setTimeout(resolve, 200));
    controller.abort();
    assert.deepEqual(await searching, errorResult("Tool call aborted: the turn was stopped before it ran", { aborted: true }));
  });

  test("a search's refusals come back from its thread as the tool's words", async () => {
    const runner = runnerFor();
    assert.equal(await refused(runner, "grep", { pattern: "x", path: "missing" }), '"missing": no such file or directory');
    assert.equal(await refused(runner, "find", { pattern: "*", path: "a.txt" }), "a.txt is not a directory");
    assert.match(await refused(runner, "grep", { pattern: "(" }), /^invalid regular expression "\(": /);
  });

  test("a walk stops after walkMaxEntries entries and says so", async () => {
    fs.mkdirSync(path.join(root, "wide"));
    for (let index = 0; index < 10; index++) fs.writeFileSync(path.join(root, "wide", `f${index}.txt`), "needle\n");
    const runner = runnerFor({ walkMaxEntries: 4 });
    const listed = await ok(runner, "ls", { path: "wide" });
    assert.equal(listed.details.complete, false);
    assert.equal(listed.details.entries, 4);
    assert.match(text(listed), /\[wide has more than 4 entries; only the first 4 read are listed/);
    const found = await ok(runner, "find", { pattern: "*.txt" });
    assert.match(text(found), /\[Stopped after looking at 4 directory entries; search a narrower path\.\]$/);
    const grepped = await ok(runner, "grep", { pattern: "needle" });
    assert.equal(grepped.details.truncated, true);
    assert.match(text(grepped), /\[Stopped after looking at 4 directory entries/);
  });

  test("a workspace reached through a symlink is its real folder; absolute paths through either are inside", async () => {
    const via = path.join(base, "via");
    fs.symlinkSync(root, via);
    const runner = new ToolRunner(via, { execSlots: null });
    assert.equal(runner.workspace.root, fs.realpathSync(root));
    assert.equal(text(await ok(runner, "read", { path: path.join(via, "a.txt") })), "alpha\nbeta\ngamma\n");
    assert.equal(text(await ok(runner, "read", { path: path.join(root, "a.txt") })), "alpha\nbeta\ngamma\n");
    assert.throws(() => new ToolRunner(path.join(base, "missing")), { code: "ENOENT" });
    assert.throws(() => new ToolRunner(path.join(root, "a.txt")), /not a directory/);
  });

  test("a result over the cap keeps its head and tail and the whole text in fullText", async () => {
    fs.writeFileSync(path.join(root, "many.txt"), Array.from({ length: 400 }, (_, i) => `line ${i}`).join("\n"));
    const result = await ok(runnerFor({ resultMaxBytes: 1024, artifactMaxBytes: 8192 }), "read", { path: "many.txt" });
    assert.equal(result.details.truncated, true);
    assert.match(text(result), /^line 0\n/);
    assert.match(text(result), /\n…\[\d+ bytes omitted\]…\n/);
    assert.ok(Buffer.byteLength(text(result)) < 1100);
    assert.ok(result.fullText.startsWith("line 0\nline 1\n"));
  });
});

describe("exec", () => {
  test("a command runs in the workspace with the allowlisted environment only", async () => {
    process.env.OPENCLAW_TEST_SECRET = "do-not-leak";
    try {
      const result = await ok(runnerFor(), "exec", { command: "pwd; env", env: { EXTRA: "yes" } });
      const lines = text(result).split("\n");
      assert.equal(lines[0], fs.realpathSync(root));
      assert.ok(lines.includes("EXTRA=yes"));
      assert.ok(lines.includes("TERM=dumb"));
      assert.ok(!text(result).includes("do-not-leak"));
      assert.equal(result.details.exitCode, 0);
      assert.equal(result.details.timedOut, false);
      assert.equal(result.details.truncated, false);
      assert.equal(typeof result.details.durationMs, "number");
    } finally {
      delete process.env.OPENCLAW_TEST_SECRET;
    }
  });

  test("stdout and stderr are one stream, stdin is closed, the exit code is reported", async () => {
    const result = await call(runnerFor(), "exec", { command: "echo out; echo err >&2; cat; exit 4" });
    assert.equal(result.isError, true);
    assert.equal(text(result), "out\nerr\n\n(Command exited with code 4)");
    assert.equal(result.details.exitCode, 4);
  });

  test("the exec request resolves the workdir inside the workspace and refuses one outside", () => {
    const runner = runnerFor();
    fs.mkdirSync(path.join(root, "sub"));
    const prepared = runner.prepare("exec", '{"command": "ls", "workdir": "sub", "env": {"B": "1", "A": "2"}, "timeoutSeconds": 5}');
    assert.deepEqual(runner.execRequest(prepared.call), {
      command: "ls",
      workdir: path.join(fs.realpathSync(root), "sub"),
      envKeys: ["A", "B"],
      timeoutS: 5,
    });
    const outsideCall = runner.prepare("exec", JSON.stringify({ command: "ls", workdir: outside }));
    assert.equal(outsideCall.ok, false);
    assert.match(text(outsideCall.result), /^workdir ".*" is outside the workspace$/);
    const fileCall = runner.prepare("exec", '{"command": "ls", "workdir": "a.txt"}');
    assert.equal(text(fileCall.result), 'workdir "a.txt" is not a directory in the workspace');
    // A folder that went away after prepare: execRequest says so, for the model.
    fs.rmSync(path.join(root, "sub"), { recursive: true });
    assert.throws(() => runner.execRequest(prepared.call), (error) => {
      assert.ok(error instanceof ToolCallError);
      assert.equal(error.message, 'workdir "sub" is not a directory in the workspace');
      return true;
    });
  });

  test("huge output is capped: head and tail for the model, the start kept as fullText", async () => {
    const result = await ok(runnerFor({ resultMaxBytes: 2048, artifactMaxBytes: 8192 }), "exec", {
      command: "echo START; head -c 3000000 /dev/zero | tr '\\0' x; echo; echo END",
    });
    assert.equal(result.details.truncated, true);
    assert.equal(result.details.outputBytes, 6 + 3000000 + 1 + 4);
    assert.match(text(result), /^START\nx+\n…\[\d+ bytes omitted\]…\nx+\nEND\n$/);
    assert.ok(Buffer.byteLength(text(result)) < 2200);
    assert.ok(result.fullText.startsWith("START\nxxx"));
    assert.match(result.fullText, /\n…\[\d+ more bytes not kept\]$/);
  });

  test("a timed-out command is killed with the background child it started", async () => {
    const result = await call(runnerFor(), "exec", { command: "sleep 60 & echo $! > bg.pid; wait", timeoutSeconds: 1 });
    assert.equal(result.isError, true);
    assert.equal(result.details.timedOut, true);
    assert.equal(text(result), "(Command timed out after 1 seconds and was killed)");
    const pid = Number(fs.readFileSync(path.join(root, "bg.pid"), "utf8"));
    assert.ok(await gone(pid), `background child ${pid} still runs`);
  });

  test("what a finished command left in its group is killed", async () => {
    const result = await ok(runnerFor(), "exec", { command: "sleep 60 & echo $! > bg.pid; echo started" });
    assert.equal(text(result), "started\n");
    const pid = Number(fs.readFileSync(path.join(root, "bg.pid"), "utf8"));
    assert.ok(await gone(pid), `background child ${pid} still runs`);
  });

  test("a command that ignores SIGTERM is killed after the grace", async () => {
    const result = await call(runnerFor({ execKillGraceMs: 300 }), "exec", {
      command: "trap '' TERM; sleep 60",
      timeoutSeconds: 1,
    });
    assert.equal(result.details.timedOut, true);
    assert.equal(result.details.exitCode, -9);
  });

  test("an abort kills the running command's group at once", async () => {
    const runner = runnerFor();
    const controller = new AbortController();
    const prepared = runner.prepare("exec", '{"command": "sleep 60 & echo $! > bg.pid; echo running; wait"}');
    const running = runner.run(prepared.call, { signal: controller.signal });
    for (let attempt = 0; attempt < 200 && !fs.existsSync(path.join(root, "bg.pid")); attempt++) {
      await new Promise((resolve) => setTimeout(resolve, 25));
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
    controller.abort();
    const result = await running;
    assert.equal(result.isError, true);
    assert.equal(result.details.aborted, true);
    assert.equal(text(result), "Command aborted: the turn was stopped while it ran; its output so far:\nrunning\n");
    const pid = Number(fs.readFileSync(path.join(root, "bg.pid"), "utf8"));
    assert.ok(await gone(pid));
  });

  test("a call whose turn was already aborted does not run", async () => {
    const runner = runnerFor();
    const controller = new AbortController();
    controller.abort();
    for (const [name, args] of [
      ["exec", { command: "touch ran" }],
      ["write", { path: "ran", content: "x" }],
    ]) {
      const result = await runner.run(runner.prepare(name, JSON.stringify(args)).call, { signal: controller.signal });
      assert.deepEqual(result, errorResult("Tool call aborted: the turn was stopped before it ran", { aborted: true }));
    }
    assert.ok(!fs.existsSync(path.join(root, "ran")));
  });

  test("a command holding a NUL byte is a tool error, not a thrown one", async () => {
    const result = await call(runnerFor(), "exec", { command: "echo a\u0000b" });
    assert.equal(text(result), "Command could not start: the command contains a NUL byte");
    assert.equal(result.isError, true);
    assert.equal(result.details.exitCode, null);
  });

  test("a command killed by a signal says which", async () => {
    const result = await call(runnerFor(), "exec", { command: "kill -9 $$" });
    assert.equal(text(result), "(Command terminated by SIGKILL)");
    assert.equal(result.details.exitCode, -9);
  });

  test("the host's exec slots bound the commands running at once", async () => {
    const runner = runnerFor({ execSlots: { dir: slotsDir, count: 1 }, execSlotWaitMs: 300 });
    const controller = new AbortController();
    const first = runner.run(runner.prepare("exec", '{"command": "sleep 60"}').call, { signal: controller.signal });
    await new Promise((resolve) => setTimeout(resolve, 200));
    const busy = await call(runner, "exec", { command: "echo second" });
    assert.equal(busy.isError, true);
    assert.equal(text(busy), "too many commands running on this host (limit 1); try again later");
    assert.deepEqual(busy.details, { exitCode: null, cwd: fs.realpathSync(root) });

    const waiting = new AbortController();
    const patient = runnerFor({ execSlots: { dir: slotsDir, count: 1 }, execSlotWaitMs: 30_000 });
    const queued = patient.run(patient.prepare("exec", '{"command": "echo x"}').call, { signal: waiting.signal });
    await new Promise((resolve) => setTimeout(resolve, 200));
    waiting.abort();
    assert.deepEqual(await queued, errorResult("Command aborted: the turn was stopped before it ran", { aborted: true }));

    controller.abort();
    await first;
    assert.equal(text(await ok(runner, "exec", { command: "echo free" })), "free\n");
  });

  test("a slot held by another process is shared across processes and freed when that process dies", async () => {
    const slots = new ExecSlots(slotsDir, 1);
    const holder = execFileSync(
      process.execPath,
      [
        "--input-type=module",
        "-e",
        `import {ExecSlots} from ${JSON.stringify(new URL("../tools.mjs", import.meta.url).href)};
         const slots = new ExecSlots(${JSON.stringify(slotsDir)}, 1);
         await slots.hold(1000, undefined, async () => { process.stdout.write(String(await slots.tryEach() === null)); });`,
      ],
      { encoding: "utf8" },
    );
    assert.equal(holder, "true");
    // The holder has exited: its slot is free again.
    assert.equal(await slots.hold(1000, undefined, async () => "held"), "held");
  });

  test("a process that connects to the output socket first is not taken for the command", { skip: !fs.existsSync("/proc/self/fd") }, async () => {
    // A stranger (a daemon an earlier command left) connects as soon as the socket listens, and writes first.
    const listen = net.Server.prototype.listen;
    const strangers = [];
    net.Server.prototype.listen = function listenWithStranger(address, callback, ...rest) {
      if (typeof address !== "string" || !address.startsWith("\0openclaw-exec-output-")) {
        return listen.call(this, address, callback, ...rest);
      }
      return listen.call(this, address, () => {
        const stranger = net.connect(address);
        strangers.push(stranger);
        stranger.on("error", () => {});
        stranger.once("connect", () => stranger.write("forged output!!!", () => setTimeout(callback, 50)));
      });
    };
    try {
      const result = await ok(runnerFor({ execSlots: null }), "exec", { command: "echo real" });
      assert.equal(text(result), "real\n");
      assert.equal(strangers.length, 1);
    } finally {
      net.Server.prototype.listen = listen;
      for (const stranger of strangers) stranger.destroy();
    }
  });

  const canInherit = fs.existsSync("/proc/self/fdinfo") && fs.existsSync("/bin/bash");
  test("a descriptor the worker inherited does not reach the command", { skip: !canInherit }, () => {
    // bash starts the worker with /dev/zero open at fd 40, not close-on-exec (Node marks the low ones itself):
    // the command finds /dev/null there.
    const script = `import {ToolRunner} from ${JSON.stringify(new URL("../tools.mjs", import.meta.url).href)};
      const runner = new ToolRunner(${JSON.stringify(root)}, {execSlots: null});
      const prepared = runner.prepare("exec", '{"command": "readlink /proc/self/fd/40"}');
      process.stdout.write((await runner.run(prepared.call)).content[0].text);`;
    const printed = execFileSync(
      "/bin/bash",
      ["-c", 'exec 40</dev/zero; exec "$0" --input-type=module -e "$1"', process.execPath, script],
      { encoding: "utf8" },
    );
    assert.equal(printed, "/dev/null\n");
  });

  test("a refused exec is answered as the Python loop answers it", () => {
    assert.deepEqual(refusedExecResult("exec denied: not on the allowlist", false), {
      content: [{ type: "text", text: "exec denied: not on the allowlist" }],
      details: { denied: true },
      isError: true,
    });
    assert.deepEqual(refusedExecResult("", true), {
      content: [{ type: "text", text: "not run: the turn was aborted" }],
      details: { aborted: true },
      isError: true,
    });
  });
});
