// The worker spawned, started, fed and read by OpenClaw's own supervisor code (the installed package's
// `createChildAdapter` with the options NH `prepareNodeWorkerLaunchTransport` passes, its start gate, its
// stdin serializer, and stdout framed and parsed as NH `observeNodeWorkerChildOutput` does): the process
// protocol checked by the party that speaks it, not by a copy of its rules.

import assert from "node:assert/strict";
import os from "node:os";
import path from "node:path";
import { before, describe, test } from "node:test";

import { BOUND_MS, CREDENTIAL, GatewayDouble, TURN_ID, descriptor, launch, makeBundle, sse, tempDir } from "./harness.mjs";
import { openclawSupervisorPieces } from "./openclaw_dist.mjs";

// NH NODE_WORKER_STDOUT_MAX_BYTES
const STDOUT_MAX_BYTES = 65536;

let openclaw;
let bundle;
before(async () => {
  openclaw = await openclawSupervisorPieces();
  if (openclaw === null && process.env.CI === "true") throw new Error("CI: OpenClaw's package (OPENCLAW_DIST) is missing");
  bundle = makeBundle();
});

/** Launch the bundle's worker for one turn as the node supervisor does; resolves once the adapter settled. */
async function superviseTurn(gateway, { during } = {}) {
  const { adapter, ready } = await openclaw.createChildAdapter({
    argv: [process.execPath, path.join(bundle, "worker.mjs"), "--internal-worker-ipc", "--internal-worker-session"],
    env: { PATH: process.env.PATH, HOME: os.homedir(), TMPDIR: os.tmpdir(), OPENCLAW_NO_RESPAWN: "1" },
    exactEnv: true,
    ownedWorker: true,
    stdinMode: "pipe-open",
    stdoutConsumption: "awaited",
    onWorkerMessage: () => {},
  });
  await ready;
  const frames = [];
  const framer = openclaw.createBoundedLineFramer(STDOUT_MAX_BYTES, "worker stdout exceeded its bound");
  const consumption = adapter.consumeStdout(async (text) => {
    for (const line of framer.push(Buffer.from(text, "utf8"))) frames.push(JSON.parse(line.toString("utf8")));
  });
  let stderr = "";
  adapter.onStderr((text) => (stderr += text));
  const write = (message) =>
    new Promise((resolve, reject) =>
      adapter.stdin.write(openclaw.serializeWorkerProcessInput(message), (error) => (error ? reject(error) : resolve())),
    );
  await adapter.openStartGate();
  const plan = descriptor({ endpointUrl: gateway.endpointUrl, workspaceDir: tempDir("oc-worker-ws-") });
  await write(openclaw.buildWorkerProcessTurn(plan));
  if (during) await during({ adapter, write });
  const exit = await adapter.wait();
  await consumption;
  adapter.dispose();
  await gateway.close();
  assert.equal(framer.pendingByteLength, 0, "a partial line was left on stdout");
  assert.ok(!stderr.includes(CREDENTIAL));
  return { exit, frames, stderr };
}

describe("under OpenClaw's own child adapter", { timeout: BOUND_MS }, () => {
  test("a turn ends with exactly one result frame OpenClaw accepts, then exit 0", async (t) => {
    if (openclaw === null) return t.skip("OpenClaw's package is not installed");
    const gateway = await GatewayDouble.start({ launch: launch(), replies: [sse.text(["Hi"])] });
    const { exit, frames, stderr } = await superviseTurn(gateway);
    assert.deepEqual(exit, { code: 0, signal: null }, stderr);
    assert.equal(frames.length, 1);
    const frame = openclaw.parseWorkerProcessResult(frames[0]);
    assert.notEqual(frame, null, "ProcessResultSchema refused the frame");
    assert.deepEqual(frame, {
      type: "result",
      turnId: TURN_ID,
      result: { status: "completed", transcriptLeafId: "leaf-0042", transcriptNextSeq: 43 },
      retainWorker: false,
    });
    assert.equal(gateway.itemsOf("end")[0].result.text, "Hi");
  });

  test("the supervisor's cancel line: the turn ends aborted, one result frame, exit 0", async (t) => {
    if (openclaw === null) return t.skip("OpenClaw's package is not installed");
    const gateway = await GatewayDouble.start({ launch: launch(), replies: [sse.hanging(["Hal"])] });
    const { exit, frames } = await superviseTurn(gateway, {
      during: async ({ write }) => {
        await gateway.waitForItem((item) => item.kind === "delta");
        await write({ type: "cancel", turnId: TURN_ID });
      },
    });
    assert.deepEqual(exit, { code: 0, signal: null });
    assert.equal(frames.length, 1);
    assert.notEqual(openclaw.parseWorkerProcessResult(frames[0]), null);
    assert.deepEqual(gateway.itemsOf("end")[0].result, { status: "aborted", text: "Hal" });
  });

  test("the supervisor's SIGTERM to the process tree: the turn ends aborted before the process goes", async (t) => {
    if (openclaw === null) return t.skip("OpenClaw's package is not installed");
    const gateway = await GatewayDouble.start({ launch: launch(), replies: [sse.hanging(["Hal"])] });
    const { exit } = await superviseTurn(gateway, {
      during: async ({ adapter }) => {
        await gateway.waitForItem((item) => item.kind === "delta");
        adapter.kill("SIGTERM");
      },
    });
    assert.equal(exit.code, 0);
    assert.deepEqual(gateway.itemsOf("end")[0].result, { status: "aborted", text: "Hal" });
  });
});
