// The worker as OpenClaw's node host runs it, against a gateway double: the process protocol (start message,
// turn line, one result line on stdout, exit 0), the turn's progress items and `end`, cancel, and failures.
//
//   node --test workers_app/openclaw_worker/tests/

import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { before, describe, test } from "node:test";

import { EXEC_LOG } from "./fake_tools.mjs";
import {
  BOUND_MS,
  CREDENTIAL,
  GatewayDouble,
  TURN_ID,
  WORKER_DIR,
  launch,
  makeBundle,
  spawnWorker,
  sse,
  tempDir,
  turnLine,
  waitFor,
} from "./harness.mjs";
import { openclawDist } from "./openclaw_dist.mjs";

const STEP_LIMIT_MESSAGE =
  "agent stopped after 2 model steps without a final answer (step limit 2); ask for a smaller task or raise the agent's step limit";

let bundle;
let dist;
before(async () => {
  bundle = makeBundle();
  dist = await openclawDist();
  if (dist === null && process.env.CI === "true") throw new Error("CI: OpenClaw's package (OPENCLAW_DIST) is missing");
});

/** Run one turn against `gateway`; checks what must hold for every run and returns the run and its result. */
async function runTurn(gateway, { workspaceDir = tempDir("oc-worker-ws-"), during, bundleDir = bundle } = {}) {
  const worker = spawnWorker(bundleDir, turnLine({ endpointUrl: gateway.endpointUrl, workspaceDir }));
  if (during) await during(worker);
  const run = await worker.finished;
  await gateway.close();
  assert.equal(run.code, 0, `worker exited ${run.code} (${run.signal}); stderr: ${run.stderr}`);
  assert.ok(run.stdout.endsWith("\n"), `stdout is not one line: ${JSON.stringify(run.stdout)}`);
  const lines = run.stdout.slice(0, -1).split("\n");
  assert.equal(lines.length, 1, `stdout carries more than the result line: ${JSON.stringify(run.stdout)}`);
  const frame = JSON.parse(lines[0]);
  if (dist !== null) assert.deepEqual(dist.parseWorkerProcessResult(frame), frame, "OpenClaw's ProcessResultSchema refuses the result");
  assert.equal(frame.turnId, TURN_ID);
  assert.equal(frame.retainWorker, false);
  assert.equal(frame.result.transcriptLeafId, "leaf-0042");
  assert.equal(frame.result.transcriptNextSeq, 43);
  assert.ok(!run.stdout.includes(CREDENTIAL) && !run.stderr.includes(CREDENTIAL), "the credential was printed");
  assert.equal(gateway.unauthorized, 0, "a request went without the turn's credential");
  const ends = gateway.itemsOf("end");
  assert.ok(ends.length <= 1, "more than one end item");
  if (ends.length) assert.equal(gateway.items.at(-1).kind, "end", "an item came after the end");
  return { run, frame, end: ends[0]?.result, workspaceDir };
}

describe("process protocol", { timeout: BOUND_MS }, () => {
  test("the turn line the harness sends is one OpenClaw's node would send", (t) => {
    if (dist === null) return t.skip("OpenClaw's package is not installed");
    const line = turnLine({ endpointUrl: "ws://127.0.0.1:9/__openclaw__/worker", workspaceDir: "/tmp" });
    assert.equal(dist.parseWorkerProcessRequest(line).turnId, TURN_ID);
  });

  test("prewarm exits 0 at once and prints nothing", async () => {
    const worker = spawnWorker(bundle, undefined, { start: false, args: ["--internal-worker-prewarm"] });
    const run = await worker.finished;
    assert.deepEqual([run.code, run.stdout, run.stderr], [0, "", ""]);
  });

  test("an IPC channel closed before the start message ends the worker quietly", async () => {
    const worker = spawnWorker(bundle, undefined, { start: false });
    worker.child.disconnect();
    const run = await worker.finished;
    assert.deepEqual([run.code, run.stdout], [0, ""]);
  });

  test("a first IPC message that is not the start message: exit 1 with the reason, nothing on stdout", async () => {
    const worker = spawnWorker(bundle, undefined, { start: false });
    worker.child.send({ type: "something-else" });
    const run = await worker.finished;
    assert.equal(run.code, 1);
    assert.equal(run.stdout, "");
    assert.match(run.stderr, /the node host's first IPC message is not the start message/u);
  });

  test("a turn line the worker cannot use: exit 1, one line on stderr, nothing on stdout", async () => {
    const usable = () => turnLine({ endpointUrl: "ws://127.0.0.1:9/__openclaw__/worker", workspaceDir: "/tmp" });
    const unusable = [
      turnLine({ endpointUrl: "http://127.0.0.1:9/elsewhere", workspaceDir: "/tmp" }),
      turnLine({ endpointUrl: "ws://127.0.0.1:9/__openclaw__/worker", workspaceDir: "relative/dir" }),
      turnLine({ endpointUrl: "ws://127.0.0.1:9/__openclaw__/worker", workspaceDir: "/tmp", credential: "short" }),
      { ...usable(), turnId: "turn-not-the-assigned-one" },
    ];
    const pinned = usable();
    pinned.descriptor.connectionEndpoint.tlsFingerprint = "not-a-fingerprint";
    unusable.push(pinned);
    for (const line of unusable) {
      const run = await spawnWorker(bundle, line).finished;
      assert.equal(run.code, 1, JSON.stringify(line).slice(0, 200));
      assert.equal(run.stdout, "");
      assert.match(run.stderr, /^openclaw-worker: the first line on stdin is not a turn this worker can run\n$/u);
      assert.ok(!run.stderr.includes(CREDENTIAL));
    }
  });
});

describe("turns", { timeout: BOUND_MS }, () => {
  test("a plain reply: deltas, then end ok with its usage; the model asked without tools", async () => {
    const gateway = await GatewayDouble.start({ launch: launch(), replies: [sse.text(["Hel", "lo"])] });
    const { frame, end } = await runTurn(gateway);
    assert.equal(frame.result.status, "completed");
    assert.deepEqual(end, {
      status: "ok",
      text: "Hello",
      stopReason: "stop",
      usage: { input: 5, output: 2, totalTokens: 7 },
      model: "mock-model",
    });
    const deltas = gateway.itemsOf("delta");
    assert.ok(deltas.length >= 1);
    assert.equal(deltas.at(-1).text, "Hello");
    assert.deepEqual(gateway.items.map((item) => item.kind), [...deltas.map(() => "delta"), "end"]);
    assert.deepEqual(gateway.inferenceRequests, [
      { model: "mock-model", messages: [{ role: "user", content: "hello" }], stream: true },
    ]);
  });

  test("deltas are cumulative and coalesced", async () => {
    const pieces = Array.from({ length: 200 }, (_, n) => `w${n} `);
    const gateway = await GatewayDouble.start({ launch: launch(), replies: [sse.text(pieces)] });
    const { end } = await runTurn(gateway);
    const deltas = gateway.itemsOf("delta");
    assert.ok(deltas.length < 20, `${deltas.length} deltas for 200 pieces arriving at once`);
    for (const delta of deltas) assert.ok(end.text.startsWith(delta.text));
    assert.equal(deltas.at(-1).text, pieces.join(""));
  });

  test("a tool call round trip: the messages and keys the Python worker emits, the result sent back", async () => {
    const workspaceDir = tempDir("oc-worker-ws-");
    fs.writeFileSync(path.join(workspaceDir, "notes.txt"), "marker-2718");
    const gateway = await GatewayDouble.start({
      launch: launch({ tools: true }),
      replies: [sse.toolCall("call_read_1", "read", { path: "notes.txt" }), sse.text(["It says marker-2718."])],
    });
    const { end } = await runTurn(gateway, { workspaceDir });
    assert.equal(end.status, "ok");
    assert.equal(end.text, "It says marker-2718.");
    assert.deepEqual(end.usage, { input: 5, output: 2, totalTokens: 7 }, "usage of every step added up");
    const [assistant, toolResult] = gateway.itemsOf("message");
    assert.equal(assistant.key, "s1.a");
    assert.deepEqual({ ...assistant.message, timestamp: 0 }, {
      role: "assistant",
      content: [{ type: "toolCall", id: "call_read_1", name: "read", arguments: { path: "notes.txt" } }],
      stopReason: "toolUse",
      timestamp: 0,
      model: "mock-model",
    });
    assert.equal(toolResult.key, "s1.r1");
    assert.deepEqual({ ...toolResult.message, timestamp: 0 }, {
      role: "toolResult",
      toolCallId: "call_read_1",
      toolName: "read",
      content: [{ type: "text", text: "marker-2718" }],
      details: {},
      isError: false,
      timestamp: 0,
    });
    assert.deepEqual(
      gateway.items.filter((item) => item.kind !== "delta").map((item) => item.kind),
      ["message", "tool", "message", "end"],
    );
    assert.deepEqual(gateway.itemsOf("tool"), [
      { kind: "tool", phase: "start", toolCallId: "call_read_1", name: "read", args: { path: "notes.txt" } },
    ]);
    const [first, second] = gateway.inferenceRequests;
    assert.deepEqual(first.tools.map((tool) => tool.function.name), ["read", "exec"]);
    assert.deepEqual(second.messages.slice(1), [
      {
        role: "assistant",
        content: "",
        tool_calls: [{ id: "call_read_1", type: "function", function: { name: "read", arguments: '{"path":"notes.txt"}' } }],
      },
      { role: "tool", tool_call_id: "call_read_1", content: "marker-2718" },
    ]);
  });

  test("an exec is put to the gateway first (asked again after 504); a denied one never runs", async () => {
    const workspaceDir = tempDir("oc-worker-ws-");
    const gateway = await GatewayDouble.start({
      launch: launch({ tools: true }),
      replies: [sse.toolCall("call_exec_1", "exec", { command: "rm -rf build" }), sse.text(["Not allowed, then."])],
      approvals: [
        { status: 504, json: { error: { code: "TIMEOUT", message: "still waiting for an operator" } } },
        { status: 200, json: { allowed: false, aborted: false, reason: "exec denied: an operator refused it" } },
      ],
    });
    const { end } = await runTurn(gateway, { workspaceDir });
    assert.equal(end.status, "ok");
    const asked = { toolCallId: "call_exec_1", command: "rm -rf build", workdir: workspaceDir, envKeys: [], timeoutS: 30 };
    assert.deepEqual(gateway.approvalRequests, [asked, asked]);
    const [, refused] = gateway.itemsOf("message");
    assert.deepEqual(refused.message.content, [{ type: "text", text: "exec denied: an operator refused it" }]);
    assert.deepEqual([refused.message.isError, refused.message.details], [true, { denied: true }]);
    assert.ok(!fs.existsSync(path.join(workspaceDir, EXEC_LOG)), "the denied command ran");
    assert.equal(gateway.inferenceRequests[1].messages.at(-1).content, "exec denied: an operator refused it");
  });

  /** A turn whose one exec gets `answer` from the approval route, which must leave the command unrun. */
  async function execAnswered(answer) {
    const workspaceDir = tempDir("oc-worker-ws-");
    const gateway = await GatewayDouble.start({
      launch: launch({ tools: true }),
      replies: [sse.toolCall("call_exec_6", "exec", { command: "make" })],
      approvals: [answer],
    });
    const ran = await runTurn(gateway, { workspaceDir });
    assert.ok(!fs.existsSync(path.join(workspaceDir, EXEC_LOG)), "the command ran");
    return { ...ran, gateway };
  }

  test("an approval the gateway refuses to give (400): end error http, the command never runs", async () => {
    const { end } = await execAnswered({ status: 400, json: { error: { code: "INVALID_REQUEST", message: "bad approval request" } } });
    assert.deepEqual(end, {
      status: "error",
      error: { kind: "http", message: "exec approval request failed: HTTP 400: bad approval request" },
    });
  });

  test("an approval answered 410 (the run ended meanwhile): the worker stops, the command never runs", async () => {
    const { frame, gateway } = await execAnswered({ status: 410, json: { error: { code: "GONE", message: "not running" } } });
    assert.equal(frame.result.status, "failed", "nobody to take the end");
    assert.equal(gateway.itemsOf("end").length, 0);
  });

  test("an allowed exec runs after the approval, whose request follows the tool's start item", async () => {
    const workspaceDir = tempDir("oc-worker-ws-");
    const gateway = await GatewayDouble.start({
      launch: launch({ tools: true }),
      replies: [sse.toolCall("call_exec_2", "exec", { command: "make test" }), sse.text(["Done."])],
    });
    let itemsBeforeApproval;
    gateway.once("approval", () => (itemsBeforeApproval = gateway.items.map((item) => item.kind)));
    const { end } = await runTurn(gateway, { workspaceDir });
    assert.equal(end.text, "Done.");
    assert.deepEqual(itemsBeforeApproval.filter((kind) => kind !== "delta"), ["message", "tool"]);
    assert.equal(fs.readFileSync(path.join(workspaceDir, EXEC_LOG), "utf8"), "make test\n");
    assert.equal(gateway.itemsOf("message")[1].message.content[0].text, "ran: make test");
  });

  test("an exec the tools refuse before asking (a workdir that is no directory): its error, no approval asked", async () => {
    const gateway = await GatewayDouble.start({
      launch: launch({ tools: true }),
      replies: [sse.toolCall("call_exec_5", "exec", { command: "ls", workdir: "notes.txt" }), sse.text(["I see."])],
    });
    const { end, workspaceDir } = await runTurn(gateway);
    assert.equal(end.status, "ok");
    assert.equal(gateway.approvalRequests.length, 0);
    const [, refused] = gateway.itemsOf("message");
    assert.deepEqual(refused.message.content, [{ type: "text", text: 'workdir "notes.txt" is not a directory in the workspace' }]);
    assert.equal(refused.message.isError, true);
    assert.ok(!fs.existsSync(path.join(workspaceDir, EXEC_LOG)));
  });

  test("the step limit ends the turn with error step_limit", async () => {
    const gateway = await GatewayDouble.start({
      launch: launch({ tools: true, maxSteps: 2 }),
      replies: [sse.toolCall("call_1", "read", { path: "a" }), sse.toolCall("call_2", "read", { path: "b" })],
    });
    const { frame, end } = await runTurn(gateway);
    assert.equal(frame.result.status, "completed");
    assert.deepEqual(end, { status: "error", error: { kind: "step_limit", message: STEP_LIMIT_MESSAGE } });
    assert.deepEqual(gateway.itemsOf("message").map((item) => item.key), ["s1.a", "s1.r1", "s2.a", "s2.r1"]);
  });
});

describe("failures", { timeout: BOUND_MS }, () => {
  // (what the test shows, the model's reply, the turn's end)
  const failedReplies = [
    [
      "an error chunk from the model: end error with the kind and message it reported",
      sse.raw([`data: ${JSON.stringify({ error: { kind: "rate_limit", message: "slow   down\nplease" } })}`]),
      { kind: "rate_limit", message: "slow down please" },
    ],
    [
      "an HTTP error from the inference route: its status and message, kind by status",
      { status: 503, json: { error: { code: "UNAVAILABLE", message: "model provider down" } } },
      { kind: "http", message: "inference request failed: HTTP 503: model provider down" },
    ],
    [
      "an error message that quotes the credential reaches the gateway redacted",
      { status: 502, json: { error: { code: "UNAVAILABLE", message: `upstream refused ${CREDENTIAL}` } } },
      { kind: "http", message: "inference request failed: HTTP 502: upstream refused [redacted]" },
    ],
    [
      "the connection dropping before an answer: end error connection",
      { hangUp: true },
      { kind: "connection", message: "inference request failed: ECONNRESET: socket hang up" },
    ],
    [
      "a malformed event stream: end error malformed",
      sse.raw(["garbage line"]),
      { kind: "malformed", message: "inference stream is malformed: unexpected line in event stream: garbage line" },
    ],
    [
      "a stream cut short (no finish reason, no [DONE]): end error malformed",
      sse.raw([`data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: "Hal" } }] })}`]),
      { kind: "malformed", message: "inference stream ended before the reply was complete" },
    ],
  ];
  for (const [name, reply, error] of failedReplies) {
    test(name, async () => {
      const gateway = await GatewayDouble.start({ launch: launch(), replies: [reply] });
      const { frame, end } = await runTurn(gateway);
      assert.equal(frame.result.status, "completed", "the end was reported");
      assert.deepEqual(end, { status: "error", error });
    });
  }

  test("a model call past the launch's timeoutMs: end error timeout", async () => {
    const gateway = await GatewayDouble.start({ launch: launch({ timeoutMs: 300 }), replies: [sse.hanging(["Hel"])] });
    const closed = new Promise((resolve) => gateway.once("inference-closed", resolve));
    const { end } = await runTurn(gateway);
    await closed;
    assert.deepEqual(end, { status: "error", error: { kind: "timeout", message: "inference request timed out after 300 ms" } });
  });

  test("a malformed launch: end error unknown, and no model call", async () => {
    const gateway = await GatewayDouble.start({ launch: { ...launch(), timeoutMs: -1 } });
    const { end } = await runTurn(gateway);
    assert.deepEqual(end, { status: "error", error: { kind: "unknown", message: "worker received a malformed launch" } });
    assert.equal(gateway.inferenceRequests.length, 0);
  });

  test("HTTP 410 on a progress post mid-stream: the model call is dropped and the worker stops", async () => {
    const gateway = await GatewayDouble.start({
      launch: launch(),
      replies: [sse.hanging(["Hel"])],
      progressStatus: () => 410,
    });
    const closed = new Promise((resolve) => gateway.once("inference-closed", resolve));
    const { frame } = await runTurn(gateway);
    await closed;
    assert.deepEqual(frame.result.status, "failed", "the end could not be reported");
    assert.equal(frame.result.reason, "turn-failed");
    assert.equal(gateway.items.length, 0);
  });

  test("a progress post the gateway could not take for a moment (503) is sent again: nothing is lost", async () => {
    const gateway = await GatewayDouble.start({
      launch: launch(),
      replies: [sse.text(["Hel", "lo"])],
      progressStatus: (post) => (post === 1 ? 503 : 200),
    });
    const { frame, end } = await runTurn(gateway);
    assert.equal(frame.result.status, "completed");
    assert.equal(end.text, "Hello");
    assert.equal(gateway.itemsOf("delta")[0].text.startsWith("Hel"), true);
  });

  test("progress the gateway refuses (400): the turn stops, its end says why", async () => {
    const gateway = await GatewayDouble.start({
      launch: launch(),
      replies: [sse.hanging(["Hel"])],
      progressStatus: (_post, items) => (items.some((item) => item.kind === "end") ? 200 : 400),
    });
    const closed = new Promise((resolve) => gateway.once("inference-closed", resolve));
    const { frame, end } = await runTurn(gateway);
    await closed;
    assert.equal(frame.result.status, "completed");
    assert.deepEqual(end, {
      status: "error",
      error: { kind: "http", message: "the gateway did not take the turn's progress: progress refused: HTTP 400: the run is not running" },
    });
  });

  test("a launch the gateway could not give for a moment (503) is asked again", async () => {
    const gateway = await GatewayDouble.start({
      launch: launch(),
      launchStatus: (request) => (request === 1 ? 503 : 200),
      replies: [sse.text(["Hi"])],
    });
    const { end } = await runTurn(gateway);
    assert.equal(end.text, "Hi");
    assert.equal(gateway.launchRequests, 2);
  });

  test("a launch the gateway refuses (403): end error http, no model call", async () => {
    const gateway = await GatewayDouble.start({ launch: launch(), launchStatus: 403 });
    const { end } = await runTurn(gateway);
    assert.deepEqual(end, { status: "error", error: { kind: "http", message: "launch request failed: HTTP 403: not now" } });
    assert.equal(gateway.inferenceRequests.length, 0);
  });

  test("HTTP 409 from the launch route: nothing runs, the worker stops", async () => {
    const gateway = await GatewayDouble.start({ launch: launch(), launchStatus: 409, progressStatus: () => 409 });
    const { frame } = await runTurn(gateway);
    assert.deepEqual(frame.result.status, "failed", "nobody took the end");
    assert.deepEqual([gateway.inferenceRequests.length, gateway.progressPosts], [0, 0]);
  });
});

/** A turn stopped by `stop(worker)` while the model streams: it ends aborted with the text so far. */
async function stoppedMidStream(stop) {
  const gateway = await GatewayDouble.start({ launch: launch(), replies: [sse.hanging(["Hel"])] });
  const { end } = await runTurn(gateway, {
    during: async (worker) => {
      await gateway.waitForItem((item) => item.kind === "delta");
      stop(worker);
    },
  });
  assert.deepEqual(end, { status: "aborted", text: "Hel" });
}

describe("cancel", { timeout: BOUND_MS }, () => {
  test("a cancel line mid-stream aborts the model call; end aborted with the text so far", async () => {
    const gateway = await GatewayDouble.start({ launch: launch(), replies: [sse.hanging(["Hel", "lo wor"])] });
    const closed = new Promise((resolve) => gateway.once("inference-closed", resolve));
    const { frame, end } = await runTurn(gateway, {
      during: async (worker) => {
        await gateway.waitForItem((item) => item.kind === "delta" && item.text === "Hello wor");
        worker.cancel();
      },
    });
    await closed;
    assert.equal(frame.result.status, "completed");
    assert.deepEqual(end, { status: "aborted", text: "Hello wor" });
  });

  test("a cancel for another turn is ignored: the turn goes on to its answer", async () => {
    const gateway = await GatewayDouble.start({ launch: launch(), replies: [sse.hanging(["Hel"])] });
    const { end } = await runTurn(gateway, {
      during: async (worker) => {
        await gateway.waitForItem((item) => item.kind === "delta");
        worker.cancel("turn-other");
        await worker.waitForStderr(/ignoring a cancel for another turn/u);
        const rest = sse.text(["lo"]).lines;
        gateway.release(rest);
      },
    });
    assert.equal(end.status, "ok");
    assert.equal(end.text, "Hello");
  });

  test("SIGTERM to the process group stops the turn the same way", () =>
    stoppedMidStream((worker) => process.kill(-worker.child.pid, "SIGTERM")));

  test("the node host's IPC channel closing mid-turn (its supervisor went away) stops the turn the same way", () =>
    stoppedMidStream((worker) => worker.child.disconnect()));

  test("a cancel while a command runs stops the command; its result says so and the turn ends aborted", async () => {
    const gateway = await GatewayDouble.start({
      launch: launch({ tools: true }),
      replies: [sse.toolCall("call_exec_3", "exec", { command: "wait-for-abort" })],
    });
    const workspaceDir = tempDir("oc-worker-ws-");
    const execLog = path.join(workspaceDir, EXEC_LOG);
    const { end } = await runTurn(gateway, {
      workspaceDir,
      during: async (worker) => {
        await waitFor(() => fs.existsSync(execLog)); // the command started
        worker.cancel();
      },
    });
    assert.equal(fs.readFileSync(execLog, "utf8"), "wait-for-abort\n");
    assert.deepEqual(end, { status: "aborted", text: "" });
    const result = gateway.itemsOf("message").find((item) => item.key === "s1.r1");
    assert.deepEqual([result.message.isError, result.message.details], [true, { aborted: true }]);
  });

  test("a cancel while the approval is pending stops waiting: the exec never runs", async () => {
    const gateway = await GatewayDouble.start({
      launch: launch({ tools: true }),
      replies: [sse.toolCall("call_exec_4", "exec", { command: "deploy" })],
      approvals: [{ hold: true }],
    });
    const { end, workspaceDir } = await runTurn(gateway, {
      during: async (worker) => {
        await new Promise((resolve) => gateway.once("approval", resolve));
        worker.cancel();
      },
    });
    assert.deepEqual(end, { status: "aborted", text: "" });
    assert.ok(!fs.existsSync(path.join(workspaceDir, EXEC_LOG)), "the command ran");
    const result = gateway.itemsOf("message").find((item) => item.key === "s1.r1");
    assert.deepEqual(result.message.content, [{ type: "text", text: "not run: the turn was aborted" }]);
    assert.deepEqual(result.message.details, { aborted: true });
  });
});


describe("with the bundle's own tools.mjs", { timeout: BOUND_MS }, () => {
  const realTools = path.join(WORKER_DIR, "tools.mjs");

  test("read and an approved exec run through tools.mjs, with its specs offered to the model", async (t) => {
    if (!fs.existsSync(realTools)) return t.skip("tools.mjs is not in this checkout yet");
    const workspaceDir = tempDir("oc-worker-ws-");
    fs.writeFileSync(path.join(workspaceDir, "notes.txt"), "marker-1618\n");
    const gateway = await GatewayDouble.start({
      launch: launch({ tools: true }),
      replies: [
        sse.toolCall("call_read_9", "read", { path: "notes.txt" }),
        sse.toolCall("call_exec_9", "exec", { command: "printf 'ran-%s' 31" }),
        sse.text(["Both done."]),
      ],
    });
    const { end } = await runTurn(gateway, { workspaceDir, bundleDir: makeBundle({ toolsFile: realTools }) });
    assert.equal(end.status, "ok");
    assert.deepEqual(
      gateway.inferenceRequests[0].tools.map((tool) => tool.function.name),
      ["read", "write", "edit", "ls", "find", "grep", "exec"],
    );
    const results = gateway.itemsOf("message").filter((item) => item.message.role === "toolResult");
    assert.deepEqual(results.map((item) => item.key), ["s1.r1", "s2.r1"]);
    assert.match(results[0].message.content[0].text, /marker-1618/u);
    assert.match(results[1].message.content[0].text, /ran-31/u);
    assert.equal(results[1].message.isError, false);
    assert.equal(gateway.approvalRequests.length, 1);
    assert.equal(gateway.approvalRequests[0].command, "printf 'ran-%s' 31");
    assert.equal(fs.realpathSync(gateway.approvalRequests[0].workdir), fs.realpathSync(workspaceDir));
  });
});
