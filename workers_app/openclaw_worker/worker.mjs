// The project's worker in OpenClaw's bundle format: the entry OpenClaw's node host runs for a turn.
//
//   node worker.mjs --internal-worker-prewarm                            → exit 0 (the bundle loads)
//   node worker.mjs --internal-worker-ipc --internal-worker-session      → one turn (below), then exit 0
//
// Standard library of Node 24 only; every `*.mjs` next to this file is part of the bundle. The turn itself
// (launch, agent loop, progress, `end`) is turn.mjs, against the gateway routes of docs/node-worker-protocol.md.
//
// What OpenClaw's node host expects of this process — confirmed in openclaw 2026.9.6's dist (chunk names are
// of that build; "NH" is dist/startup-state-migrations-BqKx_IWS.mjs):
// - Prewarm: when the install asks for it (`bundlePrewarm`), NH `NodeWorkerBundleInstaller#prewarmBundle` runs
//   `process.execPath <bundle>/worker.mjs --internal-worker-prewarm` (execFile) with cwd = the bundle, the frozen
//   worker env and a 10 min timeout (WORKER_PREWARM_TIMEOUT_MS); any non-zero exit fails the install. Output is
//   not read.
// - Spawn: NH `prepareNodeWorkerLaunchTransport` (region node-worker-launch-transport.ts) runs
//   `process.execPath <entry> --internal-worker-ipc --internal-worker-session` through `createChildAdapter`
//   (dist/child-WoujtRwa.mjs, region adapters/child.ts) with stdio [pipe, pipe, pipe, ipc], `detached: true`
//   (the worker leads its own process group: the node signals the whole group), `exactEnv` = NH
//   `snapshotNodeWorkerEnv` (only PATH, HOME, TMPDIR, TMP, TEMP, LANG, LANGUAGE, TZ, DISPLAY,
//   DBUS_SESSION_BUS_ADDRESS, XDG_RUNTIME_DIR, NODE_EXTRA_CA_CERTS, NODE_USE_SYSTEM_CA,
//   OPENCLAW_ALLOW_INSECURE_PRIVATE_WS, LC_*, plus NODE_COMPILE_CACHE and OPENCLAW_NO_RESPAWN=1): no secret
//   reaches the worker through its environment; the credential comes in the descriptor only.
//   (With `worker-lineage-start-v1` in the build's protocolFeatures the node spawns through its service-child
//   relay instead; the project's build does not declare it, so that path is not taken.)
// - Start gate: the node sends the IPC message `{type: "openclaw-worker-start-v1"}` (WORKER_START_MESSAGE,
//   child-WoujtRwa.mjs; OpenClaw's own worker accepts exactly the key `type`, optionally `lineageFds`:
//   `parseWorkerStartMessage`, dist/worker-process-LstzDIr_.mjs) and only then writes the turn to stdin
//   (`startNodeWorkerLaunchTransport`). If the IPC channel closes before the start message, OpenClaw's worker
//   exits quietly; after it, a closed channel means "the supervisor's lifetime ended": the turn is aborted.
//   The node does not expect any IPC message back. The only one it reads is the optional
//   `{type: "openclaw-worker-connection-failure-v1", cause}` (`parseNodeWorkerConnectionFailureMessage`,
//   dist/node-supervisor-protocol-BCz1HQ8e.mjs), which replaces a failed receipt's errorText; not used here.
// - Stdin: JSON lines (`serializeWorkerProcessInput`, dist/worker-process-protocol-B6pCNPWA.mjs), first
//   `{"type":"turn", turnId, descriptor}` (`buildWorkerProcessTurn`: turnId = descriptor.assignment.turnId =
//   the launchId), later possibly `{"type":"cancel", turnId}` (NH `cancelNodeWorkerTurn`, region
//   node-worker-turn-lifecycle.ts). The descriptor the node sends is OpenClaw's launch descriptor v4 completed
//   with `connectionEndpoint: {kind: "websocket", url: <the node's gateway URL>/__openclaw__/worker,
//   tlsFingerprint?, cloudflareAccess?}` (NH `resolveWorkerConnectionEndpoint`, `parseWorkerLaunchDescriptor`).
//   OpenClaw's parser accepts `assignment.toolAuthority: {allowedToolNames: []}` and `initialMessages: []` (the
//   tests' descriptor, checked with `parseWorkerProcessRequest`): the gateway need not invent tool names.
// - Stdout carries result frames only: NH `observeNodeWorkerChildOutput` frames it in lines of at most 64 KiB
//   (NODE_WORKER_STDOUT_MAX_BYTES) and parses EVERY line with `ProcessResultSchema`; any other line (an empty
//   one included) or a second result fails the turn and SIGKILLs the worker. The line is
//   `{"type":"result", turnId, result, retainWorker}` with exactly these keys (`workerProtocolObject` refuses
//   unknown keys), turnId non-blank ≤256 chars and equal to the turn's launchId (`settleNodeWorkerTurn`), result
//   one of `{status:"completed", transcriptLeafId: string|null, transcriptNextSeq: int ≥1}`,
//   `{status:"failed", reason:"turn-failed", transcriptLeafId, transcriptNextSeq}` (or OpenClaw's fenced /
//   not-started forms, not used here), and retainWorker true only with completed/failed. This worker always
//   says `retainWorker: false` and exits: the node then retires the process (`active.retiring`).
// - Exit: exit 0 after a result → receipt `completed` with the result as resultJson. Exit 0 without a result
//   → `failed` "worker exited without a complete turn result"; non-zero → `failed` "node worker failed with exit
//   code N: <stderr tail>" (the last 4 KiB of stderr, NODE_WORKER_STDERR_MAX_BYTES, scrubbed of the credential,
//   one line). So the errors below that leave no turn to report go to stderr, one line, then exit 1.
// - Cancel: the node writes the cancel line, waits 5 s (stopTimeoutMs) for the result, then SIGTERMs the
//   process group and SIGKILLs it 1 s later (NODE_WORKER_STOP_GRACE_MS, `stopNodeWorkerChild`). A cancelled
//   turn's receipt is `cancelled` whatever result it printed; the gateway learns the outcome from `end`.
// - The node scrubs the credential from what it reads of stdout/stderr (`createNodeWorkerCredentialScrubber`);
//   this worker never prints it anyway.

import process from "node:process";

import { GatewayClient, gatewayBase, normalizedFingerprint } from "./gateway_client.mjs";
import { WorkerTurn } from "./turn.mjs";

const START_MESSAGE_TYPE = "openclaw-worker-start-v1";
const MAX_STDIN_LINE_BYTES = 64 * 1024 * 1024;
// After a cancel the node waits 5 s for the result before it signals the process group.
const CANCEL_GRACE_MS = 4_000;
const IDENTIFIER_MAX_CHARS = 256;

let credentialForLogs = null;

/** One line on stderr, never the credential. */
function log(message) {
  let line = String(message).replace(/\s+/gu, " ").trim();
  if (credentialForLogs) {
    for (const form of [credentialForLogs, encodeURIComponent(credentialForLogs), JSON.stringify(credentialForLogs).slice(1, -1)]) {
      line = line.replaceAll(form, "[redacted]");
    }
  }
  process.stderr.write(`openclaw-worker: ${line}\n`);
}

/** Exit with a one-line reason on stderr: the node puts it in the receipt's errorText. */
function fail(message) {
  log(message);
  process.exitCode = 1;
  finish();
}

function finish() {
  if (process.connected) {
    try {
      process.disconnect();
    } catch {
      // already closed
    }
  }
  // Open sockets (a keep-alive connection, a model call being torn down) must not keep the turn's process.
  setImmediate(() => process.exit());
}

const isObject = (value) => value !== null && typeof value === "object" && !Array.isArray(value);
const identifier = (value) =>
  typeof value === "string" && value.length > 0 && value.length <= IDENTIFIER_MAX_CHARS && value.trim() === value;

/** What this worker uses of the turn line; null when the line does not say it. */
function parseTurnLine(value) {
  if (!isObject(value) || value.type !== "turn" || !identifier(value.turnId) || !isObject(value.descriptor)) return null;
  const { connectionEndpoint: endpoint, admission, assignment } = value.descriptor;
  if (!isObject(endpoint) || endpoint.kind !== "websocket" || typeof endpoint.url !== "string") return null;
  if (!isObject(admission) || typeof admission.credential !== "string") return null;
  if (admission.credential.length < 16 || admission.credential.length > 256) return null;
  if (!isObject(assignment) || !identifier(assignment.runId) || assignment.turnId !== value.turnId) return null;
  if (typeof assignment.workspaceDir !== "string" || !assignment.workspaceDir.startsWith("/")) return null;
  const transcript = assignment.transcript;
  if (!isObject(transcript) || !(transcript.baseLeafId === null || identifier(transcript.baseLeafId))) return null;
  if (!Number.isSafeInteger(transcript.nextSeq) || transcript.nextSeq < 1) return null;
  const base = gatewayBase(endpoint.url);
  if (base === null) return null;
  // A pin this worker cannot read must not quietly become no pin.
  if (endpoint.tlsFingerprint !== undefined && normalizedFingerprint(endpoint.tlsFingerprint) === null) return null;
  const access = endpoint.cloudflareAccess;
  return {
    turnId: value.turnId,
    runId: assignment.runId,
    workspaceDir: assignment.workspaceDir,
    transcript: { leafId: transcript.baseLeafId, nextSeq: transcript.nextSeq },
    client: {
      base,
      credential: admission.credential,
      ...(isObject(access) && typeof access.clientId === "string" && typeof access.clientSecret === "string"
        ? { cloudflareAccess: { clientId: access.clientId, clientSecret: access.clientSecret } }
        : {}),
      ...(typeof endpoint.tlsFingerprint === "string" ? { tlsFingerprint: endpoint.tlsFingerprint } : {}),
    },
  };
}

/** The result line for the node: completed once the gateway has the turn's end, else failed. */
function resultLine(turn, delivered) {
  const cursor = { transcriptLeafId: turn.transcript.leafId, transcriptNextSeq: turn.transcript.nextSeq };
  const result = delivered ? { status: "completed", ...cursor } : { status: "failed", reason: "turn-failed", ...cursor };
  return `${JSON.stringify({ type: "result", turnId: turn.turnId, result, retainWorker: false })}\n`;
}

/** Calls `onLine(text)` for each line of stdin (bounded); `onEnd()` when it closes. */
function readLines(stream, onLine, onEnd) {
  let pending = Buffer.alloc(0);
  stream.on("data", (chunk) => {
    pending = pending.length ? Buffer.concat([pending, chunk]) : chunk;
    let newline;
    while ((newline = pending.indexOf(10)) !== -1) {
      const line = pending.subarray(0, newline).toString("utf8");
      pending = pending.subarray(newline + 1);
      if (line.trim()) onLine(line);
    }
    if (pending.length > MAX_STDIN_LINE_BYTES) {
      pending = Buffer.alloc(0);
      fail("a line on stdin is longer than 64 MiB");
    }
  });
  stream.once("end", onEnd);
  stream.once("error", onEnd);
}

function runSession() {
  if (!process.connected || typeof process.send !== "function") {
    fail("--internal-worker-ipc needs the node host's IPC channel");
    return;
  }
  let started = false;
  let turn = null; // {parsed, worker}
  let ended = false;
  const early = [];

  const cancel = (why) => {
    if (turn === null || ended || turn.worker.cancelled) return;
    log(`cancelling the turn (${why})`);
    turn.worker.cancel();
    // A tool that does not stop must not cost the turn its result: the node signals the group after 5 s.
    setTimeout(() => printResult(false), CANCEL_GRACE_MS).unref();
  };

  const printResult = (delivered) => {
    if (ended) return;
    ended = true;
    process.stdout.write(resultLine(turn.parsed, delivered), () => finish());
  };

  const startTurn = (parsed) => {
    credentialForLogs = parsed.client.credential;
    const worker = new WorkerTurn({
      client: new GatewayClient(parsed.client),
      runId: parsed.runId,
      workspaceDir: parsed.workspaceDir,
      log,
    });
    turn = { parsed, worker };
    worker
      .run()
      .then(({ delivered }) => printResult(delivered))
      .catch((error) => {
        log(`the turn failed: ${error?.message ?? error}`);
        printResult(false);
      });
  };

  const onLine = (text) => {
    if (!started) {
      early.push(text);
      return;
    }
    let value;
    try {
      value = JSON.parse(text);
    } catch {
      if (turn === null) fail("the first line on stdin is not JSON");
      else log("ignoring a line on stdin that is not JSON");
      return;
    }
    if (turn === null) {
      const parsed = parseTurnLine(value);
      if (parsed === null) fail("the first line on stdin is not a turn this worker can run");
      else startTurn(parsed);
      return;
    }
    if (isObject(value) && value.type === "cancel") {
      if (value.turnId === turn.parsed.turnId) cancel("the node asked");
      else log("ignoring a cancel for another turn");
      return;
    }
    log(`ignoring a line of type ${JSON.stringify(String(value?.type ?? "")).slice(0, 40)}: this worker runs one turn`);
  };

  process.on("message", (message) => {
    if (started) {
      // OpenClaw's own worker ends its supervised lifetime on any later message (`createWorkerIpcLifetime`).
      if (turn === null) fail("unexpected IPC message from the node host");
      else cancel("an unexpected IPC message from the node host");
      return;
    }
    if (!isObject(message) || message.type !== START_MESSAGE_TYPE) {
      fail("the node host's first IPC message is not the start message");
      return;
    }
    started = true;
    for (const text of early.splice(0)) onLine(text);
  });
  process.once("disconnect", () => {
    if (turn === null) finish(); // the node gave up before the turn: nothing to do
    else cancel("the node host's IPC channel closed");
  });
  process.once("SIGTERM", () => {
    if (turn === null) finish();
    else cancel("SIGTERM");
  });
  readLines(
    process.stdin,
    onLine,
    () => {
      if (turn === null) finish();
      else cancel("stdin closed");
    },
  );
}

// A bug must still end the process with one line for the node's receipt, never a stack on stdout.
process.on("uncaughtException", (error) => fail(`worker failed: ${error?.message ?? error}`));
process.on("unhandledRejection", (error) => fail(`worker failed: ${error?.message ?? error}`));

function main(argv) {
  if (argv.includes("--internal-worker-prewarm")) return; // loading the modules was the check
  if (argv.includes("--internal-worker-ipc") && argv.includes("--internal-worker-session")) {
    runSession();
    return;
  }
  log("usage: worker.mjs --internal-worker-prewarm | --internal-worker-ipc --internal-worker-session");
  process.exitCode = 2;
}

main(process.argv.slice(2));
