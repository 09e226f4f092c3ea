// What the worker tests share: the bundle as the node installs it, the worker spawned as OpenClaw's node
// supervisor spawns it, and a gateway double serving the worker routes of docs/node-worker-protocol.md with
// scripted model replies.
//
//   const bundle = makeBundle();                       // worker *.mjs + the test tool set as tools.mjs
//   const gateway = await GatewayDouble.start({launch, replies: [sse.text(["Hel", "lo"])]});
//   const worker = spawnWorker(bundle, turnLine({gateway, workspaceDir}));
//   const run = await worker.finished;                 // {code, signal, stdout, stderr}
//   gateway.items                                      // the progress items, in order

import { spawn } from "node:child_process";
import { EventEmitter } from "node:events";
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const HERE = path.dirname(fileURLToPath(import.meta.url));
export const WORKER_DIR = path.dirname(HERE);
export const CREDENTIAL = "tok_Worker-Credential_0123456789abcdefghijklmn";
export const RUN_ID = "run-7f3a";
export const TURN_ID = "turn-51c2";
export const INFERENCE_PATH = "/api/workers/inference/chat/completions";
export const START_MESSAGE = { type: "openclaw-worker-start-v1" };
// A suite of worker runs that takes longer than this has a hung worker: it fails instead of waiting forever.
export const BOUND_MS = 120_000;

/** Resolves once `condition()` holds (checked every 10 ms): for what a test can only see from outside. */
export async function waitFor(condition) {
  while (!condition()) await new Promise((resolve) => setTimeout(resolve, 10));
}

const temporaryDirs = [];
process.once("exit", () => {
  for (const dir of temporaryDirs) fs.rmSync(dir, { recursive: true, force: true });
});

/** A temporary directory, removed when the process ends. */
export function tempDir(prefix) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  temporaryDirs.push(dir);
  return dir;
}

/** The bundle as the node installs it (files only, mode 0600), with `toolsFile` as tools.mjs (the test tool
 * set unless told otherwise). */
export function makeBundle({ toolsFile = path.join(HERE, "fake_tools.mjs") } = {}) {
  const dir = tempDir("oc-worker-bundle-");
  for (const name of fs.readdirSync(WORKER_DIR)) {
    const source = path.join(WORKER_DIR, name);
    if (name.endsWith(".mjs") && name !== "tools.mjs" && fs.statSync(source).isFile()) {
      fs.copyFileSync(source, path.join(dir, name));
      fs.chmodSync(path.join(dir, name), 0o600);
    }
  }
  fs.copyFileSync(toolsFile, path.join(dir, "tools.mjs"));
  return dir;
}

/** OpenClaw's launch descriptor v4 as the node completes it (valid for OpenClaw's own parser). */
export function descriptor({ endpointUrl, workspaceDir, credential = CREDENTIAL, runId = RUN_ID, turnId = TURN_ID }) {
  return {
    version: 4,
    connectionEndpoint: { kind: "websocket", url: endpointUrl },
    admission: {
      environmentId: "env-4d1e",
      credential,
      sessionId: "sess-9b0c",
      ownerEpoch: 3,
      rpcSetVersion: 1,
      handshake: { bundleHash: "a".repeat(64), openclawVersion: "2026.9.6-django", protocolFeatures: [] },
    },
    assignment: {
      agentId: "main",
      operationalRunInstance: { instanceId: "inst-1", runId },
      agentRuntimeIdentityToken: "identity",
      runId,
      turnId,
      prompt: "hello",
      suppressPromptTranscript: true,
      workspaceDir,
      modelRef: { provider: "project", model: "mock" },
      inferenceOptions: {},
      initialMessages: [],
      transcript: { baseLeafId: "leaf-0042", nextSeq: 43 },
      liveEvents: { ackedSeq: 0, nextSeq: 1 },
      toolAuthority: { allowedToolNames: [] },
    },
  };
}

export function turnLine(options) {
  return { type: "turn", turnId: options.turnId ?? TURN_ID, descriptor: descriptor(options) };
}

/** The launch the gateway answers (`GET /api/workers/turns/<runId>/launch`). */
export function launch({ tools = false, maxSteps = 8, timeoutMs = 60_000, messages } = {}) {
  return {
    runId: RUN_ID,
    model: "mock-model",
    messages: messages ?? [{ role: "user", content: "hello" }],
    timeoutMs,
    agent: { maxSteps, tools, execTimeoutMs: 30_000 },
    inference: { path: INFERENCE_PATH },
  };
}

// --- scripted model replies ---------------------------------------------------------------------------

const chunk = (delta, extra = {}) =>
  `data: ${JSON.stringify({ id: "chatcmpl-1", object: "chat.completion.chunk", model: "mock-model", choices: [{ index: 0, delta, finish_reason: null }], ...extra })}`;

export const sse = {
  /** A reply streaming `pieces` of text, then its finish reason, usage and [DONE]. */
  text(pieces, { usage = { prompt_tokens: 5, completion_tokens: 2, total_tokens: 7 } } = {}) {
    return {
      lines: [
        ...pieces.map((piece) => chunk({ content: piece })),
        `data: ${JSON.stringify({ id: "chatcmpl-1", model: "mock-model", choices: [{ index: 0, delta: {}, finish_reason: "stop" }] })}`,
        `data: ${JSON.stringify({ id: "chatcmpl-1", model: "mock-model", choices: [], usage })}`,
        "data: [DONE]",
      ],
    };
  },
  /** A reply asking for one tool call, its arguments split in two fragments. */
  toolCall(id, name, args) {
    const text = JSON.stringify(args);
    const half = Math.floor(text.length / 2);
    return {
      lines: [
        chunk({ tool_calls: [{ index: 0, id, type: "function", function: { name, arguments: text.slice(0, half) } }] }),
        chunk({ tool_calls: [{ index: 0, function: { arguments: text.slice(half) } }] }),
        `data: ${JSON.stringify({ id: "chatcmpl-1", model: "mock-model", choices: [{ index: 0, delta: {}, finish_reason: "tool_calls" }] })}`,
        "data: [DONE]",
      ],
    };
  },
  /** Some text, then the stream stays open (until the worker hangs up, or GatewayDouble.release()). */
  hanging(pieces) {
    return { lines: pieces.map((piece) => chunk({ content: piece })), hang: true };
  },
  raw(lines) {
    return { lines };
  },
};

// --- the gateway double --------------------------------------------------------------------------------

/**
 * The worker routes of one run. `replies` are the model's replies in order (`{lines, hang?}`, `{status,
 * json}` or `{hangUp: true}`); `launchStatus` the launch route's status (or `(n) => status` of its n-th
 * request); `approvals` the approval route's answers in order (`{status, json}`); `progressStatus(n)` the
 * status of the n-th progress post (200 unless it says otherwise). Every request is checked for the bearer
 * credential (401 otherwise). Events: "item" (each progress item), "inference-closed" (a hanging reply's
 * connection closed by the worker), "approval" (each approval request).
 */
export class GatewayDouble extends EventEmitter {
  static async start(options) {
    const gateway = new GatewayDouble(options);
    await new Promise((resolve) => gateway.server.listen(0, "127.0.0.1", resolve));
    return gateway;
  }

  constructor({ launch: launchBody, launchStatus = 200, replies = [], approvals = [], progressStatus = () => 200 }) {
    super();
    this.launchBody = launchBody;
    this.launchStatus = launchStatus;
    this.replies = [...replies];
    this.approvals = [...approvals];
    this.progressStatus = progressStatus;
    this.items = [];
    this.progressPosts = 0;
    this.inferenceRequests = [];
    this.approvalRequests = [];
    this.unauthorized = 0;
    this.sockets = new Set();
    this.server = http.createServer((request, response) => this.handle(request, response));
    this.server.on("connection", (socket) => {
      this.sockets.add(socket);
      socket.once("close", () => this.sockets.delete(socket));
    });
  }

  get endpointUrl() {
    return `ws://127.0.0.1:${this.server.address().port}/__openclaw__/worker`;
  }

  /** The progress items of one kind. */
  itemsOf(kind) {
    return this.items.filter((item) => item.kind === kind);
  }

  /** Resolves with the first progress item for which `matches(item)` holds (now or later). */
  waitForItem(matches) {
    const found = this.items.find(matches);
    if (found) return Promise.resolve(found);
    return new Promise((resolve) => {
      const listener = (item) => {
        if (!matches(item)) return;
        this.off("item", listener);
        resolve(item);
      };
      this.on("item", listener);
    });
  }

  close() {
    for (const socket of this.sockets) socket.destroy();
    return new Promise((resolve) => this.server.close(resolve));
  }

  async handle(request, response) {
    const body = await readJson(request);
    if (request.headers.authorization !== `Bearer ${CREDENTIAL}`) {
      this.unauthorized += 1;
      return send(response, 401, { error: { code: "INVALID_REQUEST", message: "inference token refused" } });
    }
    const route = `${request.method} ${request.url}`;
    if (route === `GET /api/workers/turns/${RUN_ID}/launch`) {
      this.launchRequests = (this.launchRequests ?? 0) + 1;
      const status = typeof this.launchStatus === "function" ? this.launchStatus(this.launchRequests) : this.launchStatus;
      if (status !== 200) return send(response, status, { error: { code: "UNAVAILABLE", message: "not now" } });
      return send(response, 200, this.launchBody);
    }
    if (route === `POST ${INFERENCE_PATH}`) return this.infer(body, request, response);
    if (route === `POST /api/workers/turns/${RUN_ID}/progress`) return this.progress(body, response);
    if (route === `POST /api/workers/turns/${RUN_ID}/approval`) return this.approval(body, response);
    return send(response, 404, { error: { code: "NOT_FOUND", message: `no route ${route}` } });
  }

  infer(body, request, response) {
    this.inferenceRequests.push(body);
    const reply = this.replies.shift();
    if (reply === undefined) return send(response, 500, { error: { code: "UNAVAILABLE", message: "no reply scripted" } });
    if (reply.hangUp) return request.socket.destroy(); // the connection drops before any answer
    if (reply.status !== undefined) return send(response, reply.status, reply.json);
    response.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
    response.write(reply.lines.map((line) => `${line}\n\n`).join(""));
    if (!reply.hang) return response.end();
    this.hanging = response;
    response.once("close", () => this.emit("inference-closed"));
  }

  /** The rest of the hanging reply: `lines`, then the end of its body. */
  release(lines) {
    this.hanging.end(lines.map((line) => `${line}\n\n`).join(""));
  }

  progress(body, response) {
    this.progressPosts += 1;
    const status = this.progressStatus(this.progressPosts, body.items);
    if (status !== 200) return send(response, status, { error: { code: "CONFLICT", message: "the run is not running" } });
    for (const item of body.items) {
      this.items.push(item);
      this.emit("item", item);
    }
    send(response, 200, { ok: true });
  }

  approval(body, response) {
    this.approvalRequests.push(body);
    this.emit("approval", body);
    const answer = this.approvals.shift() ?? { status: 200, json: { allowed: true, aborted: false, reason: "" } };
    if (answer.hold) return; // never answered: the worker must stop waiting on its own
    send(response, answer.status, answer.json);
  }
}

function readJson(request) {
  return new Promise((resolve) => {
    const chunks = [];
    request.on("data", (part) => chunks.push(part));
    request.on("end", () => {
      const text = Buffer.concat(chunks).toString("utf8");
      try {
        resolve(text ? JSON.parse(text) : null);
      } catch {
        resolve(text);
      }
    });
  });
}

function send(response, status, json) {
  const body = JSON.stringify(json);
  response.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
  response.end(body);
}

// --- the worker process -------------------------------------------------------------------------------

/**
 * Spawn the bundle's worker as OpenClaw's node supervisor does (`createChildAdapter`: stdio [pipe, pipe, pipe,
 * ipc], its own process group, an exact small environment), send the start message, then the turn line.
 * `finished` resolves with {code, signal, stdout, stderr} once the process is gone.
 */
export function spawnWorker(bundleDir, line, { start = true, args = ["--internal-worker-ipc", "--internal-worker-session"] } = {}) {
  const child = spawn(process.execPath, [path.join(bundleDir, "worker.mjs"), ...args], {
    cwd: bundleDir,
    stdio: ["pipe", "pipe", "pipe", "ipc"],
    detached: true,
    env: { PATH: process.env.PATH, HOME: os.homedir(), TMPDIR: os.tmpdir(), LANG: "C.UTF-8", OPENCLAW_NO_RESPAWN: "1" },
  });
  let stdout = "";
  let stderr = "";
  child.stdout.setEncoding("utf8").on("data", (text) => (stdout += text));
  child.stderr.setEncoding("utf8").on("data", (text) => (stderr += text));
  // Not "close": Node never emits it for a child whose IPC channel the parent closed right after the spawn.
  const ended = (stream) => new Promise((resolve) => stream.once("close", resolve));
  const exited = new Promise((resolve) => child.once("exit", (code, signal) => resolve({ code, signal })));
  const finished = Promise.all([exited, ended(child.stdout), ended(child.stderr)]).then(([{ code, signal }]) => ({
    code,
    signal,
    stdout,
    stderr,
  }));
  if (start) {
    child.send(START_MESSAGE, () => {
      if (line !== undefined) child.stdin.write(`${typeof line === "string" ? line : JSON.stringify(line)}\n`);
    });
  }
  return {
    child,
    finished,
    cancel: (turnId = TURN_ID) => child.stdin.write(`${JSON.stringify({ type: "cancel", turnId })}\n`),
    /** Resolves once the worker's stderr matches `pattern`. */
    waitForStderr: (pattern) =>
      new Promise((resolve) => {
        const check = () => {
          if (!pattern.test(stderr)) return;
          child.stderr.off("data", check);
          resolve();
        };
        child.stderr.on("data", check);
        check();
      }),
    get stderr() {
      return stderr;
    },
  };
}
